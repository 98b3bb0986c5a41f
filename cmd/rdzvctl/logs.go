package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/controller/lifecycle"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

func (c *command) logsCmd() *cobra.Command {
	var (
		node, since string
		follow      bool
		tail        uint32
	)
	cmd := &cobra.Command{
		Use:   "logs JOB",
		Short: "Print a job's output from all its nodes, or one",
		Long: `Print a job's output, read from the nodes that hold it. By default every
node of the job's current generation is read and the lines are merged as
they come, each prefixed with NODE/RANK; --node reads one node and prints
its log as it is. Only the job's current run is shown: output of an earlier
job of the same name is not.

--tail counts lines (of each node's log). --since takes a duration (10m) or
a time (RFC 3339); a log's lines carry no time of their own, so it starts
with the generation that was running at that time.

-f follows the job until it ends, across its generations: when a generation
ends (a failure, a restart), rdzvctl waits for the next and reads its nodes,
each change marked by a line starting "=== rdzvctl:"; a dropped stream (a
controller failover) is resumed where it was, nothing printed twice.`,
		Example: `  rdzvctl logs train
  rdzvctl logs train --tail 20 -f
  rdzvctl logs train --node gpu-03 --since 30m`,
		Args:              exactArgs(1, "logs takes one job name"),
		ValidArgsFunction: c.completeJobs,
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &rdzvv1.StreamLogsRequest{Job: args[0], Node: node, Follow: follow, TailLines: tail, AllNodes: node == ""}
			if tail > wire.MaxLogTailLines {
				return fmt.Errorf("%w: --tail: at most %d lines, got %d", errUsage, wire.MaxLogTailLines, tail)
			}
			if since != "" {
				at, err := parseSince(since, c.clock.Now())
				if err != nil {
					return err
				}
				req.Since = timestamppb.New(at)
			}
			client, err := c.dial()
			if err != nil {
				return err
			}
			out := &logWriter{out: c.out, prefix: node == "", nodes: map[string]*nodeLog{}}
			if follow {
				return errors.Join(c.followLogs(cmd.Context(), client, req, out), out.flush())
			}
			err = c.streamLogs(cmd.Context(), client, req, out)
			if err != nil && cmd.Context().Err() == nil {
				return errors.Join(out.flush(), c.rpcErr("streaming logs", err))
			}
			return out.flush()
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "read this node only, unprefixed (default: every node of the job, merged)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep streaming, across the job's generations, until the job ends")
	cmd.Flags().Uint32Var(&tail, "tail", 0, "start this many lines before the end of each node's log (0: whole log)")
	cmd.Flags().StringVar(&since, "since", "", "start with the generation running at this time: a duration back from now (10m) or RFC 3339")
	return cmd
}

// streamLogs copies one StreamLogs call to out until it ends: nil at the
// end of the logs (with follow: once the generation's workers are gone).
func (c *command) streamLogs(ctx context.Context, client rdzvv1.JobServiceClient, req *rdzvv1.StreamLogsRequest, out *logWriter) error {
	// A followed log has no deadline; the operator ends it.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.StreamLogs(sctx, req)
	if err != nil {
		return err
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := out.write(resp); err != nil {
			return err
		}
	}
}

// followLogs streams a job's logs until the job ends: its generation
// running now, then each next one. A stream that ends while the job still
// runs the same generation (a node's workers not started yet, a dropped
// connection, a controller failover) is opened again after a pause, out
// skipping what it already printed.
func (c *command) followLogs(ctx context.Context, client rdzvv1.JobServiceClient, req *rdzvv1.StreamLogsRequest, out *logWriter) error {
	name := req.GetJob()
	warn := c.retrying("following logs")
	// streamed is the generation read last; waiting the last line said
	// about a job that runs no generation.
	var streamed uint64
	first, waiting := true, ""
	for {
		job, err := c.getJob(ctx, client, name)
		gen, st := job.GetGeneration(), job.GetState()
		state := fmt.Sprintf("job %s %s: %s", name, strings.ToLower(stateWord(st)), job.GetReason())
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && permanent(err):
			return c.rpcErr("following logs", err)
		case err != nil:
			warn(err)
		case gen > 0 && (first || st == rdzvv1.JobState_JOB_STATE_RUNNING && (gen != streamed || inRound(job, req.GetNode()))):
			if !first {
				if err := out.flush(); err != nil {
					return err
				}
				if gen != streamed {
					if err := out.note(fmt.Sprintf("job %s generation %d running on %d nodes (restart %d): following it", name, gen, len(job.GetAssignments()), job.GetRestarts())); err != nil {
						return err
					}
				}
				// From the generation running now; out skips what was
				// printed before.
				req = &rdzvv1.StreamLogsRequest{Job: name, Node: req.GetNode(), Follow: true, AllNodes: req.GetAllNodes(), Since: timestamppb.New(c.clock.Now())}
				out.resync()
			}
			first, streamed, waiting = false, gen, ""
			newer, err := c.streamGeneration(ctx, client, req, out, gen)
			switch {
			case ctx.Err() != nil:
				return nil
			case newer:
				continue // read the new generation now
			case err != nil && permanent(err) && status.Code(err) != codes.NotFound:
				return c.rpcErr("following logs", err)
			case err != nil:
				// A node's stream dropped, or its log is not there yet.
				warn(err)
			case lifecycle.Terminal(st):
				// It had ended: all of it is printed.
				return errors.Join(out.flush(), out.note(state))
			}
		case lifecycle.Terminal(st):
			return errors.Join(out.flush(), out.note(state))
		case st != rdzvv1.JobState_JOB_STATE_RUNNING && state != waiting:
			next := "next"
			if gen == 0 {
				next = "first"
			}
			if err := errors.Join(out.flush(), out.note(state+"; waiting for its "+next+" generation")); err != nil {
				return err
			}
			waiting = state
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.clock.After(watchEvery):
		}
	}
}

// getJob asks for a job under --timeout.
func (c *command) getJob(ctx context.Context, client rdzvv1.JobServiceClient, name string) (*rdzvv1.Job, error) {
	cctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := client.GetJob(cctx, &rdzvv1.GetJobRequest{Name: name})
	return resp.GetJob(), err
}

// streamGeneration runs one StreamLogs call of generation gen until it
// ends, or until the job runs a newer generation (asked every watchEvery),
// which ends it (newer): a node whose workers run on into the next
// generation keeps the call open, and the other nodes' new output would
// wait for it. A failure to ask is left to the stream to show.
func (c *command) streamGeneration(ctx context.Context, client rdzvv1.JobServiceClient, req *rdzvv1.StreamLogsRequest, out *logWriter, gen uint64) (newer bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.streamLogs(sctx, client, req, out) }()
	for {
		select {
		case err := <-done:
			return false, err
		case <-c.clock.After(watchEvery):
		}
		if job, err := c.getJob(ctx, client, req.GetJob()); err == nil && job.GetGeneration() > gen {
			cancel()
			<-done // out is written by the stream alone until it returns
			return true, nil
		}
	}
}

// inRound reports whether node (every node: "") is in the job's current
// generation.
func inRound(job *rdzvv1.Job, node string) bool {
	if node == "" {
		return true
	}
	for _, a := range job.GetAssignments() {
		if a.GetNode() == node {
			return true
		}
	}
	return false
}

// parseSince reads --since: a duration before now, or a time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("%w: --since: want a positive duration, got %s", errUsage, s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: --since: want a duration (10m, 2h) or an RFC 3339 time (2026-01-02T15:04:05Z), got %q", errUsage, s)
	}
	return t, nil
}

// logWriter writes a job's logs line by line: merged, each line led by
// NODE/RANK so that chunks of different nodes never split a line, or one
// node's as they are. Per node it keeps where it is in the node's log (the
// generation and how much of its output was written) so that a stream
// opened again skips what was printed (resync).
type logWriter struct {
	out    io.Writer
	prefix bool
	nodes  map[string]*nodeLog
	// syncing is set after resync: a node first seen then is read from
	// its next generation's start.
	syncing bool
}

// nodeLog is where a logWriter is in one node's log.
type nodeLog struct {
	lead string
	// partial is the unfinished last line.
	partial []byte
	// gen is the generation whose start line (the agent's marker) was
	// written last, pos how many bytes of the log were written from there.
	gen uint64
	pos int64
	// syncing: skipping to the start of gen (then skip more bytes of it,
	// written before) or of a later generation.
	syncing bool
	skip    int64
	// shown is how much of partial is written (unprefixed output shows a
	// line as it comes: a progress bar has no newline).
	shown int
}

// markerGeneration reads the generation from the line the agent writes
// into a job's log when a generation starts on the node ("=== rdzv: job
// NAME generation N node ..."; agent/supervisor.go).
func markerGeneration(line []byte) (uint64, bool) {
	f := strings.Fields(string(line[:min(len(line), 128)]))
	if len(f) < 6 || f[0] != "===" || f[1] != "rdzv:" || f[2] != "job" || f[4] != "generation" {
		return 0, false
	}
	g, err := strconv.ParseUint(f[5], 10, 64)
	return g, err == nil
}

func (p *logWriter) node(name string) *nodeLog {
	n := p.nodes[name]
	if n == nil {
		n = &nodeLog{syncing: p.syncing}
		p.nodes[name] = n
	}
	return n
}

// resync makes the next stream's data of each node skip what was written.
func (p *logWriter) resync() {
	p.syncing = true
	for _, n := range p.nodes {
		// flush has written every partial line of a node not syncing.
		n.syncing, n.skip, n.partial, n.shown = true, 0, nil, 0
	}
}

func (p *logWriter) write(r *rdzvv1.StreamLogsResponse) error {
	n := p.node(r.GetNode())
	n.lead = fmt.Sprintf("%s/%d ", r.GetNode(), r.GetNodeRank())
	data := append(n.partial, r.GetData()...)
	var b bytes.Buffer
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		p.line(&b, n, data[:i+1])
		data = data[i+1:]
	}
	n.partial = data
	if !p.prefix && !n.syncing && n.skip == 0 && len(data) > n.shown {
		b.Write(data[n.shown:])
		n.shown = len(data)
	}
	_, err := p.out.Write(b.Bytes())
	return err
}

// line writes one whole line of n's log to b, or skips it.
func (p *logWriter) line(b *bytes.Buffer, n *nodeLog, line []byte) {
	g, marker := markerGeneration(line)
	if n.syncing {
		switch {
		case !marker || g < n.gen:
			return // before where this node's output was left
		case g == n.gen:
			n.syncing, n.skip, n.pos = false, n.pos, 0
		default:
			n.syncing, n.skip = false, 0
		}
	}
	if marker && g > n.gen {
		n.gen, n.pos = g, 0
	}
	n.pos += int64(len(line))
	if n.skip >= int64(len(line)) {
		n.skip -= int64(len(line))
		return
	}
	line, n.skip = line[n.skip:], 0
	if p.prefix {
		b.WriteString(n.lead)
	}
	b.Write(line[min(n.shown, len(line)):])
	n.shown = 0
}

// flush ends every node's unfinished line.
func (p *logWriter) flush() error {
	var b bytes.Buffer
	for _, name := range slices.Sorted(maps.Keys(p.nodes)) {
		n := p.nodes[name]
		if len(n.partial) == 0 || n.syncing {
			continue
		}
		// Counted as written: a stream opened again skips it, and writes
		// the rest of its line if more came.
		p.line(&b, n, n.partial)
		n.partial = nil
		if p.prefix {
			b.WriteByte('\n')
		}
	}
	_, err := p.out.Write(b.Bytes())
	return err
}

// note writes rdzvctl's own line among the logs: where a generation
// starts, why the job waits, how it ended.
func (p *logWriter) note(msg string) error {
	_, err := fmt.Fprintf(p.out, "=== rdzvctl: %s\n", msg)
	return err
}
