package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

type healthCheckJSON struct {
	Name    string    `json:"name"`
	OK      bool      `json:"ok"`
	Message string    `json:"message"`
	Since   time.Time `json:"since"`
}

// failingChecks is `rdzvctl nodes -o json` reduced to each node's failing
// health checks.
func (c *cluster) failingChecks(t *testing.T) map[string][]healthCheckJSON {
	t.Helper()
	var resp struct {
		Nodes []struct {
			Info struct {
				Name string `json:"name"`
			} `json:"info"`
			HealthChecks []healthCheckJSON `json:"health_checks"`
		} `json:"nodes"`
	}
	r := c.ctl("nodes", "-o", "json")
	require.NoError(t, r.err, "%s", r)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &resp))
	out := map[string][]healthCheckJSON{}
	for _, n := range resp.Nodes {
		for _, h := range n.HealthChecks {
			if !h.OK {
				out[n.Info.Name] = append(out[n.Info.Name], h)
			}
		}
	}
	return out
}

// Node health checks on real agents: h2's operator check fails until the
// operator removes its maintenance flag, h3's checkpoint disk (a 1 MiB
// tmpfs) is full. A two-node job waits, naming both and why, and runs on
// h1 and h2 as soon as h2's check passes; h3 never gets work.
func TestNodeHealthChecksGateWork(t *testing.T) {
	c := newCluster(t)
	flag := filepath.Join(c.dir, "maintenance")
	require.NoError(t, os.WriteFile(flag, nil, 0o644))
	// Mounted before the agents start, so that their mount namespaces
	// (ip netns exec makes one) have it; unmounted after they stop.
	disk := filepath.Join(c.dir, "ckpt-disk")
	require.NoError(t, os.MkdirAll(disk, 0o755))
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", disk).CombinedOutput(); err != nil {
		t.Fatalf("mounting a tmpfs for the full checkpoint disk: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", disk).CombinedOutput(); err != nil {
			t.Errorf("unmounting %s: %v: %s", disk, err, out)
		}
	})
	// Fill it: the write fails with ENOSPC once the disk is full.
	_ = os.WriteFile(filepath.Join(disk, "fill"), make([]byte, 2<<20), 0o644)

	checks := []map[string]any{
		{}, // h1: the built-ins only
		{"commands": []any{map[string]any{"name": "maintenance", "path": "/bin/sh",
			"args": []any{"-c", "test ! -e " + flag + " || { echo maintenance flag set >&2; exit 1; }"}}}},
		{"storage": map[string]any{"paths": []any{disk}, "min_free_bytes": 256 << 10}},
	}
	c.startEmbeddedController()
	for i, hc := range checks {
		hc["interval"] = "1s"
		data, err := yaml.Marshal(map[string]any{"health_checks": hc})
		require.NoError(t, err)
		path := filepath.Join(c.dir, fmt.Sprintf("agent-%d.yaml", i))
		require.NoError(t, os.WriteFile(path, data, 0o644))
		c.agents = append(c.agents, c.agentHost(i).Start(t, "agent", nil, append(c.agentArgv(i), "--config", path)...))
	}
	t.Cleanup(c.report)
	c.waitReady(t)
	h1, h2, h3 := c.agentHost(0).Name, c.agentHost(1).Name, c.agentHost(2).Name

	// The agents register with their verdicts: nothing to wait for.
	failing := c.failingChecks(t)
	require.NotContains(t, failing, h1)
	require.Len(t, failing[h2], 1)
	require.Equal(t, "maintenance", failing[h2][0].Name)
	require.Contains(t, failing[h2][0].Message, "exit status 1: maintenance flag set")
	require.Len(t, failing[h3], 1)
	require.Equal(t, "storage", failing[h3][0].Name)
	require.Contains(t, failing[h3][0].Message, disk+": ")
	require.Contains(t, failing[h3][0].Message, "free of 1.0 MiB, below min_free_bytes 256.0 KiB")
	require.Contains(t, failing[h3][0].Message, "not writable")
	table := c.ctlOK(t, "nodes")
	require.Contains(t, table, "UNHEALTHY (maintenance failing for ")
	require.Contains(t, table, "UNHEALTHY (storage failing for ")

	base := writeJob(t, c.dir)
	path := base.variant(t, "gated", func(spec map[string]any) {
		spec["nodes"] = map[string]any{"min": 2, "max": 2}
		spec["command"] = []any{"train.py", "--steps", "4"}
	})
	c.job = "gated"
	c.ctlOK(t, "start", path)
	j := c.waitJob(t, "gated", "waiting for healthy nodes", func(j jobJSON) bool {
		return strings.Contains(j.Reason, "failing health checks")
	})
	require.Equal(t, "JOB_STATE_PENDING", j.State)
	require.Contains(t, j.Reason, "1 of 3 nodes eligible, need 2")
	require.Contains(t, j.Reason, h2+": maintenance: exit status 1: maintenance flag set")
	require.Contains(t, j.Reason, h3+": storage: "+disk+": ")

	// The operator ends the maintenance; nobody has to uncordon anything.
	require.NoError(t, os.Remove(flag))
	j = c.waitJob(t, "gated", "finished", func(j jobJSON) bool { return finished(j.State) })
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, "reason: %s", j.Reason)
	var nodes []string
	for _, a := range j.Assignments {
		nodes = append(nodes, a.Node)
	}
	slices.Sort(nodes)
	require.Equal(t, []string{h1, h2}, nodes, "the node with the full disk never gets work")

	var events struct {
		Events []eventJSON `json:"events"`
	}
	c.ctlJSON(t, &events, "events")
	var seen []string
	for _, e := range events.Events {
		if e.Kind == "node_unhealthy" || e.Kind == "node_healthy" {
			seen = append(seen, e.Kind+" "+e.Node)
		}
	}
	require.Contains(t, seen, "node_unhealthy "+h2)
	require.Contains(t, seen, "node_unhealthy "+h3)
	require.Contains(t, seen, "node_healthy "+h2)
	require.NotContains(t, seen, "node_healthy "+h3)
}
