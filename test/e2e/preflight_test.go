package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The round smoke test: h1's link is shaped to 20 Mbit/s, below the job's
// 100. The first round (h1 and h2, in name order) leaves h1 out, and the
// job runs on h2 and its spare h3 without a restart counted.
func TestPreflightExcludesSlowNode(t *testing.T) {
	c := newCluster(t)
	c.startEmbeddedController()
	c.startAgents()
	t.Cleanup(c.report)
	c.waitReady(t)
	h1, h2, h3 := c.agentHost(0).Name, c.agentHost(1).Name, c.agentHost(2).Name
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	// Egress only: h1 sends slowly, receives at full speed.
	_, stderr, err := c.agentHost(0).Run(ctx, nil, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "20mbit", "burst", "32kbit", "latency", "400ms")
	require.NoError(t, err, "shaping %s: %s", h1, stderr)

	base := writeJob(t, c.dir)
	path := base.variant(t, "preflight", func(spec map[string]any) {
		spec["nodes"] = map[string]any{"min": 2, "max": 2, "spares": 1}
		spec["command"] = []any{"train.py", "--steps", "4"}
		spec["health"] = map[string]any{"preflight": map[string]any{"min_bandwidth_mbps": 100, "bytes": 1 << 20}}
	})
	c.job = "preflight"
	c.ctlOK(t, "start", path)
	j := c.waitJob(t, "preflight", "finished", func(j jobJSON) bool { return finished(j.State) })
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, "reason: %s", j.Reason)
	require.EqualValues(t, 2, j.Generation, "one re-planned round")
	require.Zero(t, j.Restarts, "a re-planned round is no restart")
	var nodes []string
	for _, a := range j.Assignments {
		nodes = append(nodes, a.Node)
	}
	slices.Sort(nodes)
	require.Equal(t, []string{h2, h3}, nodes)

	var excluded []eventJSON
	for _, e := range c.jobEvents(t, "preflight") {
		if e.Kind == "preflight_excluded" {
			excluded = append(excluded, e)
		}
	}
	require.Len(t, excluded, 1)
	require.Equal(t, h1, excluded[0].Node)
	require.Contains(t, excluded[0].Message, "excluded: links below 100 Mbit/s")

	// Every node of both rounds logged its verdict and what the test cost.
	for i, want := range map[int]string{0: "excluded", 1: "ok", 2: "ok"} {
		data, err := os.ReadFile(filepath.Join(c.stateDir(i), "logs", "preflight.log"))
		require.NoError(t, err)
		var verdicts []string
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, "rdzv preflight: ") {
				verdicts = append(verdicts, l)
				t.Logf("e2e: %s: %s", c.agentHost(i).Name, l)
			}
		}
		require.NotEmpty(t, verdicts, "%s ran no preflight test", c.agentHost(i).Name)
		require.Contains(t, verdicts[0], ": "+want)
	}
}
