package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/jobspec"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

type globals struct {
	controller string
	output     string
	timeout    time.Duration
	// tlsDir holds ca.crt, rdzvctl.crt and rdzvctl.key; the file flags
	// override single files.
	tlsDir, tlsCert, tlsKey, tlsCA string
	insecure                       bool
}

// Files rdzvctl looks for in its TLS directory.
const (
	clientCertFile = "rdzvctl.crt"
	clientKeyFile  = "rdzvctl.key"
)

func defaultGlobals() *globals {
	addr := os.Getenv("RDZV_CONTROLLER")
	if addr == "" {
		addr = "127.0.0.1:7070"
	}
	dir := os.Getenv("RDZV_TLS_DIR")
	if home, err := os.UserHomeDir(); dir == "" && err == nil {
		dir = filepath.Join(home, ".rdzv")
	}
	return &globals{controller: addr, output: "table", timeout: 10 * time.Second, tlsDir: dir}
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.controller, "controller", g.controller, "controller host:port, or replicas' host:port,host:port,...")
	fs.StringVar(&g.output, "o", g.output, "output format: table or json")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "per-request timeout")
	fs.StringVar(&g.tlsDir, "tls-dir", g.tlsDir, "directory with ca.crt, rdzvctl.crt and rdzvctl.key")
	fs.StringVar(&g.tlsCert, "tls-cert", g.tlsCert, "client certificate (default TLS_DIR/rdzvctl.crt)")
	fs.StringVar(&g.tlsKey, "tls-key", g.tlsKey, "client key (default TLS_DIR/rdzvctl.key)")
	fs.StringVar(&g.tlsCA, "tls-ca", g.tlsCA, "cluster CA certificate (default TLS_DIR/ca.crt)")
	fs.BoolVar(&g.insecure, "insecure", g.insecure, "no TLS, for a controller started with --insecure")
}

func (g *globals) tlsFiles() pki.Files {
	f := pki.Files{Cert: g.tlsCert, Key: g.tlsKey, CA: g.tlsCA}
	for _, d := range []struct {
		path *string
		name string
	}{{&f.Cert, clientCertFile}, {&f.Key, clientKeyFile}, {&f.CA, pki.CACertFile}} {
		if *d.path == "" {
			*d.path = filepath.Join(g.tlsDir, d.name)
		}
	}
	return f
}

// newClient is a client of the controllers named by --controller: mutual
// TLS with the operator's certificate, or none with --insecure.
func (g *globals) newClient() (*client.Client, error) {
	addrs, err := client.ParseAddrs("--controller", g.controller)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	cfg := client.DefaultConfig()
	cfg.Endpoints, cfg.Insecure = addrs, g.insecure
	if g.insecure {
		return client.New(cfg)
	}
	cfg.TLS = &client.TLS{Files: g.tlsFiles()}
	c, err := client.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w; rdzvctl needs a valid client certificate: put ca.crt, %s and %s in --tls-dir or $RDZV_TLS_DIR (now %q), "+
			"e.g. `rdzvctl pki issue operator NAME --out %s` on the CA host; or pass --insecure for a controller started with --insecure",
			err, clientCertFile, clientKeyFile, g.tlsDir, filepath.Join(g.tlsDir, "rdzvctl"))
	}
	return c, nil
}

type command struct {
	*globals
	out    io.Writer
	client *client.Client
}

// jobFailedError is returned by --wait when the job did not succeed.
type jobFailedError struct{ job *rdzvv1.Job }

func (e *jobFailedError) Error() string {
	return fmt.Sprintf("job %s %s: %s", e.job.GetSpec().GetName(), stateWord(e.job.GetState()), e.job.GetReason())
}

func (c *command) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("rdzvctl "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.register(fs)
	return fs
}

// dial prepares calls to the controllers; each call finds the leader among
// them (see package client).
func (c *command) dial() (*client.Client, error) {
	if c.output != "table" && c.output != "json" {
		return nil, fmt.Errorf("%w: -o must be table or json, got %q", errUsage, c.output)
	}
	if c.client == nil {
		cl, err := c.newClient()
		if err != nil {
			return nil, err
		}
		c.client = cl
	}
	return c.client, nil
}

func (c *command) close() {
	if c.client != nil {
		_ = c.client.Close()
	}
}

// rpcErr turns a gRPC error into an operator-facing one.
func (c *command) rpcErr(what string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", what, err)
	}
	if reason, _, ok := wire.Parse(err); ok {
		if reason == wire.ReasonEtcdUnavailable {
			return fmt.Errorf("%s: refused by the controller: %s", what, st.Message())
		}
		return fmt.Errorf("%s: no controller at %s leads right now (election or failover under way; retry): %s", what, c.controller, st.Message())
	}
	if expired := c.certExpired(); expired != "" && (st.Code() == codes.Unavailable || st.Code() == codes.Unauthenticated) {
		// The controller closes a connection once its client certificate
		// expires, which a call in flight sees as a dropped connection.
		return fmt.Errorf("%s: %s", what, expired)
	}
	switch st.Code() {
	case codes.Unavailable:
		hint := ""
		if c.insecure {
			// A TLS controller just drops a plaintext connection.
			hint = " (is the controller using TLS? --insecure works only with a controller started with --insecure)"
		}
		return fmt.Errorf("%s: cannot reach the controller at %s (set --controller or RDZV_CONTROLLER)%s: %s", what, c.controller, hint, st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: the controller at %s did not answer within %s", what, c.controller, c.timeout)
	}
	return fmt.Errorf("%s: %s", what, st.Message())
}

// certExpired says how rdzvctl's own certificate has expired, or "" when it
// has not (or cannot be read: the call's own error says more then).
func (c *command) certExpired() string {
	if c.insecure {
		return ""
	}
	path := c.tlsFiles().Cert
	cert, err := pki.ReadCert(path)
	if err != nil || time.Now().Before(cert.NotAfter) {
		return ""
	}
	return fmt.Sprintf("this client's certificate %s expired at %s, and the controller refuses or closes connections made with it: "+
		"issue a new one (rdzvctl pki issue operator NAME on the CA host) into %s",
		path, cert.NotAfter.UTC().Format(time.RFC3339), filepath.Dir(path))
}

func (c *command) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.timeout)
}

func (c *command) printJSON(m proto.Message) error {
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true, Indent: "  "}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(c.out, string(b))
	return err
}

func (c *command) start(ctx context.Context, args []string) error {
	fs := c.flags("start")
	wait := fs.Bool("wait", false, "follow the job until it ends; exit non-zero unless it succeeds")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: start takes one job file, got %d arguments", errUsage, len(pos))
	}
	spec, err := jobspec.LoadFile(pos[0])
	if err != nil {
		return err
	}
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	client, err := c.dial()
	if err != nil {
		return err
	}
	cctx, cancel := c.call(ctx)
	resp, err := client.StartJob(cctx, &rdzvv1.StartJobRequest{Spec: spec.ToProto()})
	cancel()
	if err != nil {
		return c.rpcErr("starting job", err)
	}
	if !*wait {
		if c.output == "json" {
			return c.printJSON(resp.GetJob())
		}
		fmt.Fprintln(c.out, resp.GetJob().GetSpec().GetName())
		return nil
	}
	fmt.Fprintf(c.out, "job %s submitted\n", spec.Name)
	return c.wait(ctx, client, spec.Name)
}

// wait follows a job until it ends, printing its events as they are
// written (see waitForJob). It rides out a controller failover or restart:
// errors are retried until the job ends or the operator interrupts.
func (c *command) wait(ctx context.Context, client rdzvv1.JobServiceClient, name string) error {
	get := func(ctx context.Context) (*rdzvv1.Job, error) {
		cctx, cancel := c.call(ctx)
		defer cancel()
		resp, err := client.GetJob(cctx, &rdzvv1.GetJobRequest{Name: name})
		return resp.GetJob(), err
	}
	job, err := waitForJob(ctx, client, name, get, c.out, c.retrying("following job"))
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("stopped following job %s (it keeps running): %w", name, ctx.Err())
	case err != nil:
		return c.rpcErr("following job", err)
	case job.GetState() == rdzvv1.JobState_JOB_STATE_SUCCEEDED:
		fmt.Fprintf(c.out, "job %s succeeded: %s\n", name, job.GetReason())
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
			fmt.Fprintf(os.Stderr, "rdzvctl: %s (retrying)\n", msg)
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

// listFlags are the filters of `list`, `status` and `nodes`.
type listFlags struct {
	states, selector *string
	limit            *int
}

func (c *command) listFlags(fs *flag.FlagSet, states string, selector bool) listFlags {
	f := listFlags{
		states: fs.String("state", "", "only these states, comma-separated: "+states),
		limit:  fs.Int("limit", 0, "print at most this many (0: all)"),
	}
	if selector {
		f.selector = fs.String("selector", "", "only nodes with all these labels: k=v,k2=v2")
	}
	return f
}

// check refuses a negative --limit.
func (f listFlags) check() error {
	if *f.limit < 0 {
		return fmt.Errorf("%w: --limit: must be 0 (all) or more, got %d", errUsage, *f.limit)
	}
	return nil
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

func (c *command) status(ctx context.Context, args []string) error {
	fs := c.flags("status")
	filter := c.listFlags(fs, jobStates, false)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("%w: status takes at most one job name", errUsage)
	}
	if len(pos) == 0 {
		return c.listJobs(ctx, filter)
	}
	client, err := c.dial()
	if err != nil {
		return err
	}
	cctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := client.GetJob(cctx, &rdzvv1.GetJobRequest{Name: pos[0]})
	if err != nil {
		return c.rpcErr("getting job", err)
	}
	if c.output == "json" {
		return c.printJSON(resp.GetJob())
	}
	printJob(c.out, resp.GetJob())
	return nil
}

// jobStates are the names --state takes for jobs.
const jobStates = "pending, running, recovering, stopping, succeeded, failed, stopped"

func (c *command) list(ctx context.Context, args []string) error {
	fs := c.flags("list")
	filter := c.listFlags(fs, jobStates, false)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return fmt.Errorf("%w: list takes no arguments", errUsage)
	}
	return c.listJobs(ctx, filter)
}

// listJobs prints the jobs page by page: a summary of each in a table, the
// whole record with -o json.
func (c *command) listJobs(ctx context.Context, filter listFlags) error {
	if err := filter.check(); err != nil {
		return err
	}
	states, err := parseStates[rdzvv1.JobState](*filter.states, "JOB_STATE_", rdzvv1.JobState_value)
	if err != nil {
		return err
	}
	client, err := c.dial()
	if err != nil {
		return err
	}
	req := &rdzvv1.ListJobsRequest{States: states, PageSize: int32(min(*filter.limit, math.MaxInt32)), View: rdzvv1.JobView_JOB_VIEW_SUMMARY}
	if c.output == "json" {
		req.View = rdzvv1.JobView_JOB_VIEW_FULL
	}
	out := &listOut{out: c.out, json: c.output == "json", field: "jobs", header: jobsHeader, limit: *filter.limit}
	err = c.eachPage(ctx, func(ctx context.Context, token string) (string, error) {
		req.PageToken = token
		resp, err := client.ListJobs(ctx, req)
		if err != nil {
			return "", c.rpcErr("listing jobs", err)
		}
		if err := printPage(out, resp.GetJobs(), jobRow); err != nil || out.full() {
			return "", err
		}
		return resp.GetNextPageToken(), nil
	})
	if err != nil {
		return err
	}
	return out.end()
}

func (c *command) nodes(ctx context.Context, args []string) error {
	fs := c.flags("nodes")
	reason := fs.String("reason", "", "why the node is cordoned (shown in nodes and events)")
	filter := c.listFlags(fs, "ready, busy, lost", true)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) == 2 && (pos[0] == "cordon" || pos[0] == "uncordon"):
		return c.cordon(ctx, pos[0] == "cordon", pos[1], *reason)
	case len(pos) != 0:
		return fmt.Errorf("%w: nodes takes no arguments, or cordon|uncordon NODE", errUsage)
	}
	if err := filter.check(); err != nil {
		return err
	}
	states, err := parseStates[rdzvv1.NodeState](*filter.states, "NODE_STATE_", rdzvv1.NodeState_value)
	if err != nil {
		return err
	}
	selector, err := parseSelector(*filter.selector)
	if err != nil {
		return err
	}
	client, err := c.dial()
	if err != nil {
		return err
	}
	req := &rdzvv1.ListNodesRequest{States: states, Selector: selector, PageSize: int32(min(*filter.limit, math.MaxInt32))}
	out := &listOut{out: c.out, json: c.output == "json", field: "nodes", header: nodesHeader, limit: *filter.limit}
	err = c.eachPage(ctx, func(ctx context.Context, token string) (string, error) {
		req.PageToken = token
		resp, err := client.ListNodes(ctx, req)
		if err != nil {
			return "", c.rpcErr("listing nodes", err)
		}
		if err := printPage(out, resp.GetNodes(), nodeRow); err != nil || out.full() {
			return "", err
		}
		return resp.GetNextPageToken(), nil
	})
	if err != nil {
		return err
	}
	return out.end()
}

func (c *command) cordon(ctx context.Context, cordon bool, name, reason string) error {
	client, err := c.dial()
	if err != nil {
		return err
	}
	cctx, cancel := c.call(ctx)
	defer cancel()
	var node *rdzvv1.Node
	if cordon {
		resp, err := client.CordonNode(cctx, &rdzvv1.CordonNodeRequest{Name: name, Reason: reason})
		if err != nil {
			return c.rpcErr("cordoning node", err)
		}
		node = resp.GetNode()
	} else {
		resp, err := client.UncordonNode(cctx, &rdzvv1.UncordonNodeRequest{Name: name})
		if err != nil {
			return c.rpcErr("uncordoning node", err)
		}
		node = resp.GetNode()
	}
	if c.output == "json" {
		return c.printJSON(node)
	}
	if node.GetCordoned() {
		fmt.Fprintf(c.out, "node %s cordoned: %s\n", name, node.GetCordonReason())
	} else {
		fmt.Fprintf(c.out, "node %s uncordoned\n", name)
	}
	return nil
}

func (c *command) logs(ctx context.Context, args []string) error {
	fs := c.flags("logs")
	node := fs.String("node", "", "node to read from (default: node rank 0)")
	follow := fs.Bool("f", false, "keep streaming until the job's workers on that node exit")
	tail := fs.Uint64("tail", 0, "start this many bytes before the end (0: whole log)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: logs takes one job name", errUsage)
	}
	client, err := c.dial()
	if err != nil {
		return err
	}
	// A followed log has no deadline; the operator ends it.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.StreamLogs(sctx, &rdzvv1.StreamLogsRequest{Job: pos[0], Node: *node, Follow: *follow, TailBytes: *tail})
	if err != nil {
		return c.rpcErr("streaming logs", err)
	}
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return c.rpcErr("streaming logs", err)
		}
		if _, err := c.out.Write(chunk.GetData()); err != nil {
			return err
		}
	}
}

func (c *command) events(ctx context.Context, args []string) error {
	fs := c.flags("events")
	limit := fs.Uint("limit", 0, "newest N events (default: the controller's, 1000; with --follow, 20)")
	var follow bool
	fs.BoolVar(&follow, "f", false, "keep printing events as they are written (alias of --follow)")
	fs.BoolVar(&follow, "follow", false, "keep printing events as they are written, across controller failovers")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("%w: events takes at most one job name", errUsage)
	}
	job := ""
	if len(pos) == 1 {
		job = pos[0]
	}
	client, err := c.dial()
	if err != nil {
		return err
	}
	if follow {
		tail := uint32(*limit)
		if tail == 0 {
			tail = followTail
		}
		err := followEvents(ctx, client, &rdzvv1.WatchEventsRequest{Job: job, Tail: tail}, printEvents(c.out, c.output == "json"), c.retrying("following events"))
		if err != nil && ctx.Err() == nil {
			return c.rpcErr("following events", err)
		}
		return nil
	}
	out := &listOut{out: c.out, json: c.output == "json", field: "events", header: eventsHeader}
	err = c.eachPage(ctx, func(ctx context.Context, token string) (string, error) {
		resp, err := client.ListEvents(ctx, &rdzvv1.ListEventsRequest{Job: job, Limit: uint32(*limit), PageToken: token})
		if err != nil {
			return "", c.rpcErr("listing events", err)
		}
		return resp.GetNextPageToken(), printPage(out, resp.GetEvents(), eventRow)
	})
	if err != nil {
		return err
	}
	return out.end()
}

func (c *command) deleteJob(ctx context.Context, args []string) error {
	pos, err := parse(c.flags("delete"), args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: delete takes one job name", errUsage)
	}
	client, err := c.dial()
	if err != nil {
		return err
	}
	cctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := client.DeleteJob(cctx, &rdzvv1.DeleteJobRequest{Name: pos[0]})
	if err != nil {
		return c.rpcErr("deleting job", err)
	}
	if c.output == "json" {
		return c.printJSON(resp)
	}
	fmt.Fprintf(c.out, "job %s deleted\n", pos[0])
	return nil
}

func (c *command) stop(ctx context.Context, args []string) error {
	fs := c.flags("stop")
	wait := fs.Bool("wait", false, "wait until every worker has exited")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: stop takes one job name", errUsage)
	}
	client, err := c.dial()
	if err != nil {
		return err
	}
	cctx, cancel := c.call(ctx)
	resp, err := client.StopJob(cctx, &rdzvv1.StopJobRequest{Name: pos[0]})
	cancel()
	if err != nil {
		return c.rpcErr("stopping job", err)
	}
	if *wait {
		var failed *jobFailedError
		if err := c.wait(ctx, client, pos[0]); err != nil && !errors.As(err, &failed) {
			return err
		}
	}
	if c.output == "json" {
		return c.printJSON(resp.GetJob())
	}
	fmt.Fprintf(c.out, "job %s %s\n", pos[0], strings.ToLower(stateWord(resp.GetJob().GetState())))
	return nil
}
