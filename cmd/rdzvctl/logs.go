package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

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
with the generation that was running at that time.`,
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
				at, err := parseSince(since, time.Now())
				if err != nil {
					return err
				}
				req.Since = timestamppb.New(at)
			}
			client, err := c.dial()
			if err != nil {
				return err
			}
			// A followed log has no deadline; the operator ends it.
			sctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			stream, err := client.StreamLogs(sctx, req)
			if err != nil {
				return c.rpcErr("streaming logs", err)
			}
			out := &prefixer{out: c.out, prefix: node == "", partial: map[string][]byte{}}
			for {
				resp, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					return out.flush()
				}
				if err != nil {
					if cmd.Context().Err() != nil {
						return out.flush()
					}
					return errors.Join(out.flush(), c.rpcErr("streaming logs", err))
				}
				if err := out.write(resp); err != nil {
					return err
				}
			}
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "read this node only, unprefixed (default: every node of the job, merged)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep streaming until the job's workers exit")
	cmd.Flags().Uint32Var(&tail, "tail", 0, "start this many lines before the end of each node's log (0: whole log)")
	cmd.Flags().StringVar(&since, "since", "", "start with the generation running at this time: a duration back from now (10m) or RFC 3339")
	return cmd
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

// prefixer writes merged logs: whole lines, each led by NODE/RANK, so that
// chunks of different nodes never split a line. Unprefixed, it writes the
// data as it comes.
type prefixer struct {
	out    io.Writer
	prefix bool
	// partial is each node's unfinished last line.
	partial map[string][]byte
	// lead is each node's prefix.
	lead map[string]string
}

func (p *prefixer) write(r *rdzvv1.StreamLogsResponse) error {
	if !p.prefix {
		_, err := p.out.Write(r.GetData())
		return err
	}
	if p.lead == nil {
		p.lead = map[string]string{}
	}
	node := r.GetNode()
	p.lead[node] = fmt.Sprintf("%s/%d ", node, r.GetNodeRank())
	data := append(p.partial[node], r.GetData()...)
	var b bytes.Buffer
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		b.WriteString(p.lead[node])
		b.Write(data[:i+1])
		data = data[i+1:]
	}
	p.partial[node] = data
	_, err := p.out.Write(b.Bytes())
	return err
}

// flush ends every node's unfinished line.
func (p *prefixer) flush() error {
	var b bytes.Buffer
	for _, node := range slices.Sorted(maps.Keys(p.partial)) {
		if data := p.partial[node]; len(data) > 0 {
			b.WriteString(p.lead[node])
			b.Write(data)
			b.WriteByte('\n')
		}
		delete(p.partial, node)
	}
	_, err := p.out.Write(b.Bytes())
	return err
}
