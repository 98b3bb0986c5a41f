package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// watchEvery is how often --watch polls the controller.
const watchEvery = 2 * time.Second

// jobStates are the names --state takes for jobs.
const jobStates = "pending, running, recovering, stopping, succeeded, failed, stopped"

// jobFailedError is returned by --wait when the job did not succeed.
type jobFailedError struct{ job *rdzvv1.Job }

func (e *jobFailedError) Error() string {
	return fmt.Sprintf("job %s %s: %s", e.job.GetSpec().GetName(), stateWord(e.job.GetState()), e.job.GetReason())
}

// format parses -o.
func (c *command) format() (output, error) { return parseOutput(c.output, c.clock) }

// stdinName names the job read from stdin in messages.
const stdinName = "<stdin>"

// loadJob reads and checks a job file, or stdin for "-", on this side: the
// same rules the controller applies (jobspec). It returns the name to
// report the job by; its errors start with that name.
func (c *command) loadJob(path string) (string, *jobspec.Spec, error) {
	name := path
	var spec *jobspec.Spec
	var err error
	if path == "-" {
		name = stdinName
		spec, err = c.readStdinJob()
	} else if spec, err = jobspec.LoadFile(path); err != nil && !errors.Is(err, jobspec.ErrInvalid) {
		err = fmt.Errorf("%s: %w", name, err) // the file's own errors start with its name
	}
	if err != nil {
		return name, nil, err
	}
	if err := spec.Validate(); err != nil {
		return name, nil, fmt.Errorf("%s: %w", name, err)
	}
	return name, spec, nil
}

// readStdinJob parses the job on stdin, its relative paths resolved
// against the working directory.
func (c *command) readStdinJob() (*jobspec.Spec, error) {
	if c.in == nil {
		return nil, fmt.Errorf("%w: - reads the job from stdin, which is a terminal or closed: pipe the job in", errUsage)
	}
	// One byte more than allowed, so that Parse says it is too long.
	data, err := io.ReadAll(io.LimitReader(c.in, jobspec.MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: reading the job: %w", stdinName, err)
	}
	spec, err := jobspec.ParseIn(data, ".")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", stdinName, err)
	}
	return spec, nil
}

func (c *command) startCmd() *cobra.Command {
	var wait, dryRun bool
	cmd := &cobra.Command{
		Use:   "start JOB.yaml|-",
		Short: "Validate and submit a job",
		Long: `Validate a job file and submit it. With --wait, follow the job to its end
and exit non-zero unless it succeeds. With --dry-run, the controller
validates the job and says which nodes it would be placed on now, or why
it would wait; nothing is stored. - reads the job from stdin.`,
		Example: `  rdzvctl start job.yaml
  rdzvctl start job.yaml --wait
  rdzvctl start job.yaml --dry-run
  rdzvctl get job train -o yaml | sed 's/^name: train$/name: train-2/' | rdzvctl start -`,
		Args: exactArgs(1, "start takes one job file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := c.format()
			if err != nil {
				return err
			}
			if wait && dryRun {
				return fmt.Errorf("%w: --wait and --dry-run exclude each other", errUsage)
			}
			if wait && o.kind != "table" {
				return fmt.Errorf("%w: -o %s: start --wait prints the job's events as text; with --wait -o takes table (the default)", errUsage, c.output)
			}
			file, spec, err := c.loadJob(args[0])
			if err != nil {
				return err
			}
			resp, err := unary(cmd.Context(), c, "starting job", func(ctx context.Context, cl *client.Client) (*rdzvv1.StartJobResponse, error) {
				return cl.StartJob(ctx, &rdzvv1.StartJobRequest{Spec: spec.ToProto(), DryRun: dryRun})
			})
			if err != nil {
				return err
			}
			c.printWarnings(file, resp.GetWarnings())
			switch {
			case dryRun:
				return renderOne(c.out, o, resp, func(w io.Writer, v view) { printPreview(w, file, resp.GetPlacement()) }, spec.Name)
			case !wait:
				return renderOne(c.out, o, resp.GetJob(), func(w io.Writer, v view) { fmt.Fprintln(w, spec.Name) }, spec.Name)
			}
			fmt.Fprintf(c.out, "job %s submitted\n", spec.Name)
			return c.wait(cmd.Context(), c.client, spec.Name, c.out)
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the job until it ends; exit non-zero unless it succeeds")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "validate on the controller and preview the placement; store nothing")
	return prints(cmd, allOutputs...)
}

// printWarnings prints the controller's warnings about a job file on
// stderr, where they do not mix with -o json or yaml.
func (c *command) printWarnings(file string, warnings []string) {
	for _, w := range warnings {
		fmt.Fprintf(c.errOut, "warning: %s: %s\n", file, w)
	}
}

// printPreview prints a dry run's placement.
func printPreview(w io.Writer, file string, p *rdzvv1.PlacementPreview) {
	fmt.Fprintf(w, "%s: valid; %s\n", file, p.GetReason())
	if len(p.GetNodes()) == 0 {
		return
	}
	t := table(w)
	fmt.Fprintln(t, "RANK\tNODE\tADDRESS\tINTERFACE\tGPUS")
	for _, a := range p.GetNodes() {
		fmt.Fprintf(t, "%d\t%s\t%s\t%s\t%s\n", a.GetNodeRank(), a.GetNode(), a.GetAddress(), a.GetNcclInterface(), uints(a.GetGpuIndices()))
	}
	_ = t.Flush()
}

func (c *command) validateCmd() *cobra.Command {
	var local bool
	cmd := &cobra.Command{
		Use:   "validate [JOB.yaml|-]...",
		Short: "Check job files here and on the controller, without starting them",
		Long: `Check job files: each parsed and validated here, then by the controller
(as start --dry-run, without printing the placement). With --local, only
here, without a controller. - (or no file, with stdin a pipe) reads a job
from stdin.

Each file's verdict is printed, its errors on stderr led by its name; the
exit status is 1 if any file is invalid.`,
		Example: `  rdzvctl validate job.yaml
  rdzvctl validate --local jobs/*.yaml
  rdzvctl init --from 'torchrun --nproc_per_node 8 train.py' | rdzvctl validate --local`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			files := args
			if len(files) == 0 {
				if c.in == nil {
					return fmt.Errorf("%w: validate takes job files, or - (or a pipe) for a job on stdin", errUsage)
				}
				files = []string{"-"}
			}
			if stdin := slices.DeleteFunc(slices.Clone(files), func(f string) bool { return f != "-" }); len(stdin) > 1 {
				return fmt.Errorf("%w: - (stdin) given more than once", errUsage)
			}
			var invalid []string
			for _, file := range files {
				name, err := c.validateOne(cmd.Context(), file, local)
				var bad *invalidJobError
				switch {
				case errors.As(err, &bad):
					fmt.Fprintln(c.errOut, bad.err)
					invalid = append(invalid, name)
				case err != nil:
					return err
				}
			}
			if len(invalid) > 0 {
				return fmt.Errorf("%d of %d job files invalid: %s", len(invalid), len(files), strings.Join(invalid, ", "))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&local, "local", false, "check here only, without asking the controller")
	return cmd
}

// invalidJobError is a job file found invalid, here or by the controller.
type invalidJobError struct{ err error }

func (e *invalidJobError) Error() string { return e.err.Error() }
func (e *invalidJobError) Unwrap() error { return e.err }

// validateOne checks one job file, or stdin for "-"; it returns the name
// the job is reported by, and an *invalidJobError for an invalid job (any
// other error ends validate: the controller did not answer).
func (c *command) validateOne(ctx context.Context, file string, local bool) (string, error) {
	name, spec, err := c.loadJob(file)
	if errors.Is(err, errUsage) {
		return name, err
	}
	if err != nil {
		return name, &invalidJobError{err: err}
	}
	if !local {
		cl, err := c.dial()
		if err != nil {
			return name, err
		}
		cctx, cancel := c.call(ctx)
		resp, err := cl.StartJob(cctx, &rdzvv1.StartJobRequest{Spec: spec.ToProto(), DryRun: true})
		cancel()
		switch {
		case status.Code(err) == codes.InvalidArgument:
			return name, &invalidJobError{err: c.rpcErr(name, err)}
		case err != nil:
			return name, c.rpcErr(name, err)
		}
		c.printWarnings(name, resp.GetWarnings())
	}
	fmt.Fprintf(c.out, "%s: job %s is valid\n", name, spec.Name)
	return name, nil
}

// wait follows a job until it ends, printing its events on w as they are
// written (see waitForJob). It rides out a controller failover or restart:
// errors are retried until the job ends or the operator interrupts.
func (c *command) wait(ctx context.Context, client rdzvv1.JobServiceClient, name string, w io.Writer) error {
	get := func(ctx context.Context) (*rdzvv1.Job, error) {
		cctx, cancel := c.call(ctx)
		defer cancel()
		resp, err := client.GetJob(cctx, &rdzvv1.GetJobRequest{Name: name})
		return resp.GetJob(), err
	}
	job, err := waitForJob(ctx, client, name, get, w, c.retrying("following job"))
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("stopped following job %s (it keeps running): %w", name, ctx.Err())
	case err != nil:
		return c.rpcErr("following job", err)
	case job.GetState() == rdzvv1.JobState_JOB_STATE_SUCCEEDED:
		fmt.Fprintf(w, "job %s succeeded: %s\n", name, job.GetReason())
		return nil
	}
	return &jobFailedError{job: job}
}

// retrying reports errors that rdzvctl rides out, each once until another
// comes.
func (c *command) retrying(what string) func(error) {
	var last string
	return func(err error) {
		if msg := c.rpcErr(what, err).Error(); msg != last {
			fmt.Fprintf(c.errOut, "rdzvctl: %s (retrying)\n", msg)
			last = msg
		}
	}
}

// eachPage calls page with each page's token in turn, "" first, until the
// last page; each call has its own timeout.
func (c *command) eachPage(ctx context.Context, page func(ctx context.Context, token string) (next string, err error)) error {
	token := ""
	for {
		cctx, cancel := c.call(ctx)
		next, err := page(cctx, token)
		cancel()
		if err != nil || next == "" {
			return err
		}
		if next == token {
			return fmt.Errorf("the controller at %s answered the same page twice", c.controller)
		}
		token = next
	}
}

// collect gathers a list's pages, keeping the items keep accepts, until
// limit items (0: all).
func collect[M any](ctx context.Context, c *command, limit int, keep func(M) bool,
	page func(ctx context.Context, token string) ([]M, string, error)) ([]M, error) {
	var out []M
	err := c.eachPage(ctx, func(ctx context.Context, token string) (string, error) {
		items, next, err := page(ctx, token)
		if err != nil {
			return "", err
		}
		for _, m := range items {
			if keep == nil || keep(m) {
				out = append(out, m)
			}
			if limit > 0 && len(out) == limit {
				return "", nil
			}
		}
		return next, nil
	})
	return out, err
}

// watch prints what show renders now, and with --watch again whenever the
// data changes (key differs), polling every watchEvery until interrupted.
// Errors while watching are reported and retried.
func (c *command) watch(ctx context.Context, watching bool, o output, show func(ctx context.Context) (key []byte, print func(io.Writer) error, err error)) error {
	var last []byte
	var lastErr string
	for first := true; ; first = false {
		key, print, err := show(ctx)
		switch {
		case !first && ctx.Err() != nil:
			return nil // interrupted while watching: no failure
		case err != nil && (first || !watching):
			return err
		case err != nil:
			if err.Error() != lastErr {
				fmt.Fprintf(c.errOut, "rdzvctl: %v (retrying)\n", err)
				lastErr = err.Error()
			}
		case first || !bytes.Equal(key, last):
			if !first {
				switch o.kind {
				case "yaml":
					fmt.Fprintln(c.out, "---")
				case "table", "wide":
					fmt.Fprintln(c.out)
				}
			}
			if err := print(c.out); err != nil {
				return err
			}
			last, lastErr = key, ""
		}
		if !watching {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.clock.After(watchEvery):
		}
	}
}

// listFlags are the filters of `list`, `status` and `nodes`.
type listFlags struct {
	states, selector string
	limit            int
	watch            bool
	// all lists every item where a large list is summarized (nodes, a
	// job's workers).
	all bool
}

func (f *listFlags) register(fs *pflag.FlagSet, states, selectorHelp string) {
	fs.StringVar(&f.states, "state", "", "only these states, comma-separated: "+states)
	fs.StringVarP(&f.selector, "selector", "l", "", selectorHelp)
	fs.IntVar(&f.limit, "limit", 0, "print at most this many (0: all)")
	fs.BoolVarP(&f.watch, "watch", "w", false, "print again whenever the list changes (polls every "+watchEvery.String()+"); Ctrl-C ends")
}

// check refuses a negative --limit.
func (f *listFlags) check() error {
	if f.limit < 0 {
		return fmt.Errorf("%w: --limit: must be 0 (all) or more, got %d", errUsage, f.limit)
	}
	return nil
}

// listArgs reads what a list command (list, nodes) is asked before it asks
// the controller: the output format, and the --state and --selector
// filters, states being enum values named after prefix.
func listArgs[E ~int32](c *command, f *listFlags, prefix string, values map[string]int32) (output, []E, map[string]string, error) {
	o, err := c.format()
	if err != nil {
		return output{}, nil, nil, err
	}
	if err := f.check(); err != nil {
		return output{}, nil, nil, err
	}
	states, err := parseStates[E](f.states, prefix, values)
	if err != nil {
		return output{}, nil, nil, err
	}
	selector, err := parseSelector(f.selector)
	if err != nil {
		return output{}, nil, nil, err
	}
	return o, states, selector, nil
}

// parseStates reads --state: names of enum values after prefix, any case.
func parseStates[E ~int32](list, prefix string, values map[string]int32) ([]E, error) {
	var out []E
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		v, ok := values[prefix+strings.ToUpper(s)]
		if !ok || v == 0 {
			var names []string
			for name, v := range values {
				if v != 0 {
					names = append(names, strings.ToLower(strings.TrimPrefix(name, prefix)))
				}
			}
			sort.Strings(names)
			return nil, fmt.Errorf("%w: --state: %q is not a state; want %s", errUsage, s, strings.Join(names, ", "))
		}
		out = append(out, E(v))
	}
	return out, nil
}

// parseSelector reads --selector k=v,k2=v2.
func parseSelector(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	sel := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%w: --selector: %q is not key=value", errUsage, kv)
		}
		sel[k] = v
	}
	return sel, nil
}

// exactArgs wants n arguments, saying what with want otherwise.
func exactArgs(n int, want string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return fmt.Errorf("%w: %s, got %d arguments", errUsage, want, len(args))
		}
		return nil
	}
}

// maxArgs wants at most n arguments.
func maxArgs(n int, want string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) > n {
			return fmt.Errorf("%w: %s, got %d arguments", errUsage, want, len(args))
		}
		return nil
	}
}

func (c *command) statusCmd() *cobra.Command {
	var f listFlags
	cmd := &cobra.Command{
		Use:   "status [JOB]",
		Short: "Show one job in detail, or all jobs (as list)",
		Example: `  rdzvctl status train
  rdzvctl status train -o yaml
  rdzvctl status train --watch
  rdzvctl status -o jsonpath='{.jobs[*].spec.name}'`,
		Args:              maxArgs(1, "status takes at most one job name"),
		ValidArgsFunction: c.completeJobs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return c.listJobs(cmd.Context(), &f)
			}
			o, err := c.format()
			if err != nil {
				return err
			}
			client, err := c.dial()
			if err != nil {
				return err
			}
			return c.watch(cmd.Context(), f.watch, o, func(ctx context.Context) ([]byte, func(io.Writer) error, error) {
				cctx, cancel := c.call(ctx)
				defer cancel()
				resp, err := client.GetJob(cctx, &rdzvv1.GetJobRequest{Name: args[0]})
				if err != nil {
					return nil, nil, c.rpcErr("getting job", err)
				}
				key, err := proto.MarshalOptions{Deterministic: true}.Marshal(resp.GetJob())
				return key, func(w io.Writer) error {
					return renderOne(w, o, resp.GetJob(), func(w io.Writer, v view) {
						v.all = f.all
						printJob(w, resp.GetJob(), v)
					}, args[0])
				}, err
			})
		},
	}
	f.register(cmd.Flags(), jobStates, "without JOB: only jobs whose node selector includes all these labels: k=v,k2=v2")
	cmd.Flags().BoolVar(&f.all, "all", false, fmt.Sprintf("with JOB: list every node's workers (a job on more than %d nodes shows a summary)", summaryAbove))
	return prints(cmd, allOutputs...)
}

func (c *command) listCmd() *cobra.Command {
	var f listFlags
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List jobs, oldest first",
		Example: `  rdzvctl list
  rdzvctl list --state running,recovering -o wide
  rdzvctl list --selector pool=train -o name
  rdzvctl list --watch`,
		Args: exactArgs(0, "list takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error { return c.listJobs(cmd.Context(), &f) },
	}
	f.register(cmd.Flags(), jobStates, "only jobs whose node selector includes all these labels: k=v,k2=v2")
	return prints(cmd, allOutputs...)
}

// listJobs prints the jobs: a summary of each in a table, whole jobs in
// structured formats.
func (c *command) listJobs(ctx context.Context, f *listFlags) error {
	o, states, selector, err := listArgs[rdzvv1.JobState](c, f, "JOB_STATE_", rdzvv1.JobState_value)
	if err != nil {
		return err
	}
	client, err := c.dial()
	if err != nil {
		return err
	}
	req := &rdzvv1.ListJobsRequest{States: states, View: rdzvv1.JobView_JOB_VIEW_SUMMARY}
	if selector == nil {
		// Filtered here otherwise, so a page of the limit could hold fewer.
		req.PageSize = int32(min(f.limit, math.MaxInt32))
	}
	if o.structured() {
		req.View = rdzvv1.JobView_JOB_VIEW_FULL // scripts get whole jobs
	}
	var keep func(*rdzvv1.Job) bool
	if selector != nil {
		keep = func(j *rdzvv1.Job) bool { return includes(j.GetSpec().GetSelector(), selector) }
	}
	return c.watch(ctx, f.watch, o, func(ctx context.Context) ([]byte, func(io.Writer) error, error) {
		items, err := collect(ctx, c, f.limit, keep, func(ctx context.Context, token string) ([]*rdzvv1.Job, string, error) {
			req.PageToken = token
			resp, err := client.ListJobs(ctx, req)
			if err != nil {
				return nil, "", c.rpcErr("listing jobs", err)
			}
			return resp.GetJobs(), resp.GetNextPageToken(), nil
		})
		if err != nil {
			return nil, nil, err
		}
		key, err := listKey(items, nil)
		return key, func(w io.Writer) error { return render(w, o, jobs, items) }, err
	})
}

// includes reports whether labels hold every label of sel.
func includes(labels, sel map[string]string) bool {
	for k, v := range sel {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// listKey identifies a list's content for --watch, less what changes
// without meaning a change (a node's heartbeat).
func listKey[M proto.Message](items []M, volatile func(M)) ([]byte, error) {
	var key []byte
	for _, m := range items {
		if volatile != nil {
			m = proto.Clone(m).(M)
			volatile(m)
		}
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			return nil, err
		}
		key = fmt.Appendf(key, "%d:", len(b))
		key = append(key, b...)
	}
	return key, nil
}

// eventsMax is the most events the controller lists or replays at once
// (ListEventsRequest.limit, WatchEventsRequest.tail).
const eventsMax = 10000

// eventFilter is events' --kind, --node and --since, applied here: the
// controller lists and watches by job only.
type eventFilter struct {
	kinds map[string]bool
	node  string
	since time.Time
}

// any reports whether the filter drops anything.
func (f eventFilter) any() bool { return len(f.kinds) > 0 || f.node != "" || !f.since.IsZero() }

func (f eventFilter) keep(ev *rdzvv1.Event) bool {
	return (len(f.kinds) == 0 || f.kinds[ev.GetKind()]) && (f.node == "" || ev.GetNode() == f.node) &&
		(f.since.IsZero() || !ev.GetTime().AsTime().Before(f.since))
}

// eventKind is what an event kind looks like (job_submitted).
var eventKind = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// parseEventFilter reads --kind, --node and --since.
func parseEventFilter(kinds, node, since string, now time.Time) (eventFilter, error) {
	f := eventFilter{node: node}
	for _, k := range strings.Split(kinds, ",") {
		if k = strings.TrimSpace(k); k == "" {
			continue
		}
		if !eventKind.MatchString(k) {
			return f, fmt.Errorf("%w: --kind: %q is not an event kind; want names such as job_failed,node_lost (rdzvctl events -o jsonpath='{.events[*].kind}' lists those recorded)", errUsage, k)
		}
		if f.kinds == nil {
			f.kinds = map[string]bool{}
		}
		f.kinds[k] = true
	}
	if since != "" {
		t, err := parseSince(since, now)
		if err != nil {
			return f, err
		}
		f.since = t
	}
	return f, nil
}

// newest keeps the last n of items (n 0: all).
func newest[T any](items []T, n uint) []T {
	if n > 0 && uint(len(items)) > n {
		return items[uint(len(items))-n:]
	}
	return items
}

func (c *command) eventsCmd() *cobra.Command {
	var limit uint
	var follow bool
	var kinds, node, since string
	cmd := &cobra.Command{
		Use:   "events [JOB]",
		Short: "List a job's events, or cluster events without JOB",
		Long: `List a job's events, or every event of the cluster without JOB, oldest
first. --kind, --node and --since keep only the events that match all of
them; --limit keeps the newest N of those. Filtered, the newest 10000 events
are read (the most the controller lists at once) and matched here.

--watch (or --follow) prints the newest events first (20, or --limit), then
each new one as it is written, across controller failovers, until Ctrl-C.`,
		Example: `  rdzvctl events train
  rdzvctl events --limit 20 -o wide
  rdzvctl events train --kind attempt_failed,recovered --since 2h
  rdzvctl events --node gpu-07 --since 2026-03-04T08:00:00Z
  rdzvctl events train -o jsonpath='{.events[*].kind}'
  rdzvctl events --watch --kind node_lost   # cluster-wide, as they are written`,
		Args: maxArgs(1, "events takes at most one job name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := c.format()
			if err != nil {
				return err
			}
			filter, err := parseEventFilter(kinds, node, since, c.clock.Now())
			if err != nil {
				return err
			}
			job := ""
			if len(args) == 1 {
				job = args[0]
			}
			client, err := c.dial()
			if err != nil {
				return err
			}
			if follow {
				return c.followEvents(cmd.Context(), client, job, limit, filter, o)
			}
			req := &rdzvv1.ListEventsRequest{Job: job, Limit: uint32(min(limit, eventsMax))}
			if filter.any() {
				req.Limit = eventsMax // matched here: read as many as may be
			}
			// At most eventsMax come back: the controller's bound is
			// this list's.
			items, err := collect(cmd.Context(), c, 0, filter.keep, func(ctx context.Context, token string) ([]*rdzvv1.Event, string, error) {
				req.PageToken = token
				resp, err := client.ListEvents(ctx, req)
				if err != nil {
					return nil, "", c.rpcErr("listing events", err)
				}
				return resp.GetEvents(), resp.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return render(c.out, o, events, newest(items, limit))
		},
	}
	cmd.Flags().UintVar(&limit, "limit", 0, "newest N events (default: the controller's, 1000, or all that match a filter; with --watch, 20)")
	cmd.Flags().BoolVarP(&follow, "watch", "w", false, "keep printing events as they are written, across controller failovers (-o table, wide or json: one object a line); Ctrl-C ends")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "the same as --watch")
	cmd.Flags().StringVar(&kinds, "kind", "", "only events of these kinds, comma-separated (job_failed,node_lost)")
	cmd.Flags().StringVar(&node, "node", "", "only events about this node")
	cmd.Flags().StringVar(&since, "since", "", "only events since this time: a duration back from now (10m) or RFC 3339")
	cmd.ValidArgsFunction = c.completeJobs
	return prints(cmd, allOutputs...)
}

// followEvents prints events from the WatchEvents stream until the
// operator interrupts: an unknown job or a refused request ends it. The
// replay (the newest events first) is matched here and its newest limit
// (default followTail) printed once it is over; then each new event that
// matches as it comes.
func (c *command) followEvents(ctx context.Context, client rdzvv1.JobServiceClient, job string, limit uint, filter eventFilter, o output) error {
	switch o.kind {
	case "table", "wide", "json":
	default:
		return fmt.Errorf("%w: -o %s: events --watch prints table, wide or json (one object a line); -o takes those with --watch", errUsage, c.output)
	}
	if limit == 0 {
		limit = followTail
	}
	limit = min(limit, eventsMax)
	tail := uint32(limit)
	if filter.any() {
		tail = eventsMax // matched here: replay as many as may be
	}
	print := printEvents(c.out, o.kind == "json")
	// replay holds the replay's matching events, at most limit of them,
	// until it is over.
	var replay []*rdzvv1.WatchEventsResponse
	caughtUp := false
	handle := func(m *rdzvv1.WatchEventsResponse) (bool, error) {
		switch {
		case m.GetCaughtUp() && !caughtUp:
			caughtUp = true
			for _, r := range replay {
				if _, err := print(r); err != nil {
					return false, err
				}
			}
			replay = nil
		case m.GetEvent() == nil || !filter.keep(m.GetEvent()):
		case caughtUp:
			return print(m)
		default:
			replay = newest(append(replay, m), limit)
		}
		return false, nil
	}
	err := followEvents(ctx, client, &rdzvv1.WatchEventsRequest{Job: job, Tail: tail}, handle, c.retrying("following events"))
	if err != nil && ctx.Err() == nil {
		return c.rpcErr("following events", err)
	}
	return nil
}

func (c *command) deleteCmd() *cobra.Command {
	return prints(&cobra.Command{
		Use:   "delete JOB",
		Short: "Remove a finished job and all kept for it (events too)",
		Long: `Remove a finished job and everything the controller keeps for it: its
rounds, worker statuses, checkpoint catalog and events. A job that has not
finished is refused: stop it first. The job's output stays on the nodes
under their retention.`,
		Example:           "  rdzvctl delete train",
		Args:              exactArgs(1, "delete takes one job name"),
		ValidArgsFunction: c.completeJobs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := c.format()
			if err != nil {
				return err
			}
			resp, err := unary(cmd.Context(), c, "deleting job", func(ctx context.Context, cl *client.Client) (*rdzvv1.DeleteJobResponse, error) {
				return cl.DeleteJob(ctx, &rdzvv1.DeleteJobRequest{Name: args[0]})
			})
			if err != nil {
				return err
			}
			return renderOne(c.out, o, resp, func(w io.Writer, v view) { fmt.Fprintf(w, "job %s deleted\n", args[0]) }, args[0])
		},
	}, allOutputs...)
}

func (c *command) stopCmd() *cobra.Command {
	var wait bool
	cmd := &cobra.Command{
		Use:   "stop JOB",
		Short: "Stop a job's workers on every node",
		Example: `  rdzvctl stop train
  rdzvctl stop train --wait`,
		Args:              exactArgs(1, "stop takes one job name"),
		ValidArgsFunction: c.completeJobs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := c.format()
			if err != nil {
				return err
			}
			resp, err := unary(cmd.Context(), c, "stopping job", func(ctx context.Context, cl *client.Client) (*rdzvv1.StopJobResponse, error) {
				return cl.StopJob(ctx, &rdzvv1.StopJobRequest{Name: args[0]})
			})
			if err != nil {
				return err
			}
			if wait {
				// The events go where they do not mix with data.
				events := c.out
				if o.kind != "table" && o.kind != "wide" {
					events = c.errOut
				}
				var failed *jobFailedError
				if err := c.wait(cmd.Context(), c.client, args[0], events); err != nil && !errors.As(err, &failed) {
					return err
				}
			}
			return renderOne(c.out, o, resp.GetJob(), func(w io.Writer, v view) {
				fmt.Fprintf(w, "job %s %s\n", args[0], strings.ToLower(stateWord(resp.GetJob().GetState())))
			}, args[0])
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until every worker has exited")
	return prints(cmd, allOutputs...)
}

// completeJobs completes a job name from the controller's first page of
// jobs, for shell completion; no answer completes nothing.
func (c *command) completeJobs(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return c.complete(cmd.Context(), prefix, func(ctx context.Context, client *client.Client) ([]string, error) {
		resp, err := client.ListJobs(ctx, &rdzvv1.ListJobsRequest{View: rdzvv1.JobView_JOB_VIEW_SUMMARY})
		var names []string
		for _, j := range resp.GetJobs() {
			names = append(names, j.GetSpec().GetName())
		}
		return names, err
	})
}

// completeNodes completes a node name, as completeJobs.
func (c *command) completeNodes(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return c.complete(cmd.Context(), prefix, func(ctx context.Context, client *client.Client) ([]string, error) {
		resp, err := client.ListNodes(ctx, &rdzvv1.ListNodesRequest{})
		var names []string
		for _, n := range resp.GetNodes() {
			names = append(names, n.GetInfo().GetName())
		}
		return names, err
	})
}

func (c *command) complete(ctx context.Context, prefix string, list func(context.Context, *client.Client) ([]string, error)) ([]string, cobra.ShellCompDirective) {
	names, err := unary(ctx, c, "completing", list)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
