package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/client"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// nodeStates are the names --state takes for nodes.
const nodeStates = "ready, busy, lost, drained"

func (c *command) nodesCmd() *cobra.Command {
	var f listFlags
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List the node registry; cordon, uncordon and drain nodes",
		Long: `List the node registry, or the nodes in these states with these labels.
A node's state is READY (idle), BUSY (holding a job), LOST (silent past the
controller's timeout) or DRAINED (drained and now idle); CORDONED is shown
beside it.

More than 100 nodes show as a summary: counts by state and condition, the
nodes each job holds, and the nodes that need a look (lost, cordoned,
draining, drained, unhealthy, agent restarting). --all, --limit or -o
json/yaml/name/jsonpath list them one by one.`,
		Example: `  rdzvctl nodes
  rdzvctl nodes --state lost
  rdzvctl nodes --state ready --selector pool=train -o wide
  rdzvctl nodes -o jsonpath='{.nodes[?@.state=="NODE_STATE_READY"].info.name}'
  rdzvctl nodes --watch`,
		Args: commandArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return c.listNodes(cmd.Context(), &f) },
	}
	f.register(cmd.Flags(), nodeStates, "only nodes with all these labels: k=v,k2=v2")
	cmd.Flags().BoolVar(&f.all, "all", false, fmt.Sprintf("list every node (more than %d show as a summary)", summaryAbove))
	cmd.AddCommand(c.cordonCmd(true), c.cordonCmd(false), c.drainCmd())
	return prints(cmd, allOutputs...)
}

func (c *command) listNodes(ctx context.Context, f *listFlags) error {
	o, states, selector, err := listArgs[rdzvv1.NodeState](c, f, "NODE_STATE_", rdzvv1.NodeState_value)
	if err != nil {
		return err
	}
	client, err := c.dial()
	if err != nil {
		return err
	}
	req := &rdzvv1.ListNodesRequest{States: states, Selector: selector, PageSize: int32(min(f.limit, math.MaxInt32))}
	// Tables of many nodes are summarized; data formats and explicit
	// limits always list.
	summarize := (o.kind == "table" || o.kind == "wide") && !f.all && f.limit == 0
	return c.watch(ctx, f.watch, o, func(ctx context.Context) ([]byte, func(io.Writer) error, error) {
		if summarize {
			cctx, cancel := c.call(ctx)
			s, err := client.SummarizeNodes(cctx, &rdzvv1.SummarizeNodesRequest{States: states, Selector: selector})
			cancel()
			switch {
			case status.Code(err) == codes.Unimplemented:
				summarize = false // a controller older than summaries
			case err != nil:
				return nil, nil, c.rpcErr("listing nodes", err)
			case s.GetNodes() > summaryAbove:
				quiet := proto.CloneOf(s)
				for _, n := range quiet.GetAttention() {
					n.LastHeartbeat = nil
				}
				key, err := proto.MarshalOptions{Deterministic: true}.Marshal(quiet)
				return key, func(w io.Writer) error { return printNodeSummary(w, o, s) }, err
			}
		}
		items, err := collect(ctx, c, f.limit, nil, func(ctx context.Context, token string) ([]*rdzvv1.Node, string, error) {
			req.PageToken = token
			resp, err := client.ListNodes(ctx, req)
			if err != nil {
				return nil, "", c.rpcErr("listing nodes", err)
			}
			return resp.GetNodes(), resp.GetNextPageToken(), nil
		})
		if err != nil {
			return nil, nil, err
		}
		key, err := listKey(items, func(n *rdzvv1.Node) { n.LastHeartbeat = nil })
		return key, func(w io.Writer) error { return render(w, o, nodes, items) }, err
	})
}

func (c *command) cordonCmd(cordon bool) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:     "cordon NODE",
		Short:   "Keep new work off a node; running work is not touched",
		Example: "  rdzvctl nodes cordon gpu-07 --reason 'fan replacement'",
		Args:    exactArgs(1, "nodes cordon takes one node name"),
	}
	cmd.ValidArgsFunction = c.completeNodes
	if !cordon {
		cmd.Use, cmd.Short, cmd.Example = "uncordon NODE", "Let a node take work again (also ends a drain)", "  rdzvctl nodes uncordon gpu-07"
		cmd.Args = exactArgs(1, "nodes uncordon takes one node name")
	} else {
		cmd.Flags().StringVar(&reason, "reason", "", "why (shown in nodes and events)")
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		o, err := c.format()
		if err != nil {
			return err
		}
		what, call := "uncordoning node", func(ctx context.Context, cl *client.Client) (*rdzvv1.Node, error) {
			resp, err := cl.UncordonNode(ctx, &rdzvv1.UncordonNodeRequest{Name: args[0]})
			return resp.GetNode(), err
		}
		if cordon {
			what, call = "cordoning node", func(ctx context.Context, cl *client.Client) (*rdzvv1.Node, error) {
				resp, err := cl.CordonNode(ctx, &rdzvv1.CordonNodeRequest{Name: args[0], Reason: reason})
				return resp.GetNode(), err
			}
		}
		node, err := unary(cmd.Context(), c, what, call)
		if err != nil {
			return err
		}
		return renderOne(c.out, o, node, func(w io.Writer, v view) {
			if node.GetCordoned() {
				fmt.Fprintf(w, "node %s cordoned: %s\n", args[0], node.GetCordonReason())
			} else {
				fmt.Fprintf(w, "node %s uncordoned\n", args[0])
			}
		}, args[0])
	}
	return prints(cmd, allOutputs...)
}

func (c *command) drainCmd() *cobra.Command {
	var reason string
	var now bool
	cmd := &cobra.Command{
		Use:   "drain NODE",
		Short: "Cordon a node and let its job finish there (or stop it now)",
		Long: `Cordon a node and mark it draining: no new work goes there, and the job
running there runs on until it ends; then the node is listed DRAINED and
can be taken down. With --now the node's workers are stopped at once and
the job recovers on other nodes (a restart of the job). Uncordon ends a
drain.`,
		Example: `  rdzvctl nodes drain gpu-07
  rdzvctl nodes drain gpu-07 --now --reason 'failing DIMM'
  rdzvctl nodes --state drained`,
		Args:              exactArgs(1, "nodes drain takes one node name"),
		ValidArgsFunction: c.completeNodes,
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := c.format()
			if err != nil {
				return err
			}
			n, err := unary(cmd.Context(), c, "draining node", func(ctx context.Context, cl *client.Client) (*rdzvv1.Node, error) {
				resp, err := cl.DrainNode(ctx, &rdzvv1.DrainNodeRequest{Name: args[0], Reason: reason, Now: now})
				return resp.GetNode(), err
			})
			if err != nil {
				return err
			}
			return renderOne(c.out, o, n, func(w io.Writer, v view) {
				switch {
				case n.GetState() == rdzvv1.NodeState_NODE_STATE_DRAINED:
					fmt.Fprintf(w, "node %s drained\n", args[0])
				case now && n.GetJob() != "":
					fmt.Fprintf(w, "node %s draining: job %s stopped there, recovering on other nodes\n", args[0], n.GetJob())
				case n.GetJob() != "":
					fmt.Fprintf(w, "node %s draining: job %s runs on until it ends\n", args[0], n.GetJob())
				default:
					fmt.Fprintf(w, "node %s draining\n", args[0])
				}
			}, args[0])
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (shown in nodes and events)")
	cmd.Flags().BoolVar(&now, "now", false, "stop the node's workers now; the job recovers on other nodes")
	return prints(cmd, allOutputs...)
}

// printNodeSummary prints a summary of many nodes.
func printNodeSummary(w io.Writer, o output, s *rdzvv1.SummarizeNodesResponse) error {
	fmt.Fprintf(w, "%d nodes, %d GPUs (a summary: --all lists every node; --state, --selector or --limit narrow the list)\n\n", s.GetNodes(), s.GetGpus())
	t := table(w)
	fmt.Fprintln(t, "STATE\tNODES\tGPUS")
	for _, sc := range s.GetStates() {
		fmt.Fprintf(t, "%s\t%d\t%d\n", strings.TrimPrefix(sc.GetState().String(), "NODE_STATE_"), sc.GetNodes(), sc.GetGpus())
	}
	if err := t.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nCordoned %d, draining %d, unhealthy %d, agent restarting %d\n", s.GetCordoned(), s.GetDraining(), s.GetUnhealthy(), s.GetAgentRestarting())
	if len(s.GetJobs()) > 0 {
		fmt.Fprintln(w)
		t = table(w)
		fmt.Fprintln(t, "JOB\tNODES")
		for _, j := range s.GetJobs() {
			fmt.Fprintf(t, "%s\t%d\n", j.GetJob(), j.GetNodes())
		}
		if err := t.Flush(); err != nil {
			return err
		}
	}
	if s.GetAttentionTotal() == 0 {
		return nil
	}
	if n := len(s.GetAttention()); int32(n) < s.GetAttentionTotal() {
		fmt.Fprintf(w, "\nNeeding attention: the first %d of %d by name\n", n, s.GetAttentionTotal())
	} else {
		fmt.Fprintf(w, "\nNeeding attention: %d\n", n)
	}
	return render(w, o, nodes, s.GetAttention())
}
