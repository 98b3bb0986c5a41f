package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/test/netns"
)

// Relays end to end: rdzv-relay on h1 carries the streams of the agents on
// h2 and h3 to the controller on h0, while h4's agent reaches the
// controller directly. The relay fails while a job trains on all three
// nodes: its agents must go around it to the controller and the job train
// on in the same generation, never restarted.

const (
	relayPort = "7071"
	// relayHTTP is the relay's metrics address: its default, on its host's
	// loopback, which answers even while the host's link is cut.
	relayHTTP = "127.0.0.1:9403"
	// relayVouchedTimeout is the controller's heartbeat.vouched_timeout,
	// its default, given explicitly because the cut test means nothing
	// without it: cut off behind their relay, the agents reach the
	// controller again only after their keepalive gives the stalled stream
	// up (10 s + 5 s) and their next attempt waits out the relay
	// (relayConnectWait, 10 s). Until then they are silent to the
	// controller, which keeps their nodes, vouched for by their gossip
	// peers, for this long; a vouched timeout under about 30 s would lose
	// them and restart the job whatever the relay and agents did.
	relayVouchedTimeout = "1m"
	// relayJobSteps keeps the job training through the fault and the
	// agents' way around the relay (16 s after a cut): 45 s at
	// faultStepTime.
	relayJobSteps = 450
)

// relayedAgents are the agents (by index) that list the relay: those on
// h2 and h3. h4's, direct, is their gossip peer that the controller still
// hears while they are cut off from it, whose word vouches for them.
var relayedAgents = []int{0, 1}

// relayCluster is a cluster (see newClusterHosts) with a relay on h1.
type relayCluster struct {
	*cluster
	relayHost *netns.Host
	// relayAddr is where the relayed agents reach the relay.
	relayAddr string
	relay     *netns.Proc
	// relayKilled is set once the test killed the relay on purpose.
	relayKilled bool
}

// newRelayCluster starts a controller with embedded etcd on h0, a relay on
// h1 and agents on h2..h4, those of relayedAgents with --relays, all with
// the fault tests' short timeouts, and waits until the agents are ready.
func newRelayCluster(t *testing.T) *relayCluster {
	t.Helper()
	c := newClusterHosts(t, 2)
	relayBin := filepath.Join(filepath.Dir(c.controllerBin), "rdzv-relay")
	if info, err := os.Stat(relayBin); err != nil || info.Mode()&0o111 == 0 {
		netns.SkipOrFail(t, "e2e: %s is missing or not executable: run `make build`", relayBin)
	}
	c.heartbeatTimeout = faultHeartbeatTimeout
	c.agentArgs = []string{"--stop-grace", faultStopGrace}
	r := &relayCluster{cluster: c, relayHost: c.net.Host(1)}
	r.relayAddr = r.relayHost.IP + ":" + relayPort
	// Agents check that the relay's certificate names the address they
	// dial, as they do the controller's.
	c.pki(t, "issue", "relay", "rack-1", "--ip", r.relayHost.IP, "--dir", c.pkiDir)
	c.startController("--data-dir", c.controllerDataDir(), "--heartbeat-vouched-timeout", relayVouchedTimeout)
	// An agent that cannot reach the controller through its relay goes to
	// the controller directly, and tries the relay again only when it next
	// reconnects. So that the relayed agents' streams go through the relay
	// from the start, the controller answers before the relay dials it
	// (a refused dial would leave the relay's connection backing off) and
	// the relay listens before the agents start.
	r.poll(t, "the controller never answered", func() error {
		_, err := c.nodes()
		return err
	})
	r.relay = r.relayHost.Start(t, "relay", nil, append([]string{relayBin, "--listen", r.relayAddr, "--controller", c.controllerAddr,
		"--http-listen", relayHTTP, "--log-level", "debug"}, c.tlsArgs("relay", "rack-1")...)...)
	r.poll(t, "the relay never became ready", func() error {
		_, err := r.relayGet("/readyz")
		return err
	})
	for i := range agentHosts {
		argv := c.agentArgv(i)
		if slices.Contains(relayedAgents, i) {
			argv = append(argv, "--relays", r.relayAddr)
		}
		c.agents = append(c.agents, c.agentHost(i).Start(t, "agent", nil, argv...))
	}
	// Cleanups run last-registered first: this one runs while the daemons,
	// registered before it, still run.
	t.Cleanup(c.report)
	c.waitReady(t)
	return r
}

// poll calls try until it succeeds, failing with what and its last error
// after readyTimeout.
func (r *relayCluster) poll(t *testing.T, what string, try func() error) {
	t.Helper()
	deadline := time.Now().Add(readyTimeout)
	for {
		r.requireRunning(t)
		if r.relay != nil && !r.relayKilled {
			select {
			case <-r.relay.Exited():
				t.Fatalf("the relay exited: %v (log: %s)", r.relay.Wait(), r.relay.LogPath())
			default:
			}
		}
		err := try()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s within %s: %v", what, readyTimeout, err)
		}
		time.Sleep(pollEvery)
	}
}

// relayGet fetches path from the relay's HTTP server, from inside its
// host.
func (r *relayCluster) relayGet(path string) (string, error) {
	return runHelperOn(r.relayHost, "http-get", "http://"+relayHTTP+path)
}

var relayStreamsMetric = regexp.MustCompile(`(?m)^rdzv_relay_streams (\S+)$`)

// relayStreams is the relay's rdzv_relay_streams: the agent streams it
// carries now.
func (r *relayCluster) relayStreams() (int, error) {
	out, err := r.relayGet("/metrics")
	if err != nil {
		return 0, err
	}
	m := relayStreamsMetric.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no rdzv_relay_streams in the relay's metrics:\n%s", out)
	}
	n, err := strconv.ParseFloat(m[1], 64)
	return int(n), err
}

// waitRelayStreams waits until the relay carries n agent streams.
func (r *relayCluster) waitRelayStreams(t *testing.T, n int) {
	t.Helper()
	r.poll(t, fmt.Sprintf("the relay never carried %d agent streams", n), func() error {
		got, err := r.relayStreams()
		if err == nil && got != n {
			err = fmt.Errorf("rdzv_relay_streams %d", got)
		}
		return err
	})
}

// agentLog is one line of an agent's own log (JSON, one object a line).
type agentLog struct {
	Msg        string `json:"msg"`
	Controller string `json:"controller"`
	Relay      string `json:"relay"`
	Previous   string `json:"previous"`
}

// agentLogs decodes agent i's log lines whose message is one of msgs, in
// order.
func (r *relayCluster) agentLogs(t *testing.T, i int, msgs ...string) []agentLog {
	t.Helper()
	data, err := os.ReadFile(r.agents[i].LogPath())
	require.NoError(t, err)
	var out []agentLog
	for _, line := range strings.Split(string(data), "\n") {
		var l agentLog
		if json.Unmarshal([]byte(line), &l) == nil && slices.Contains(msgs, l.Msg) {
			out = append(out, l)
		}
	}
	return out
}

// leader is the address agent i's calls last went to, as it logged it
// ("calling through a relay", "calling the leading controller"): the
// relay, while its stream goes through it.
func (r *relayCluster) leader(t *testing.T, i int) string {
	t.Helper()
	calls := r.agentLogs(t, i, "calling through a relay", "calling the leading controller")
	if len(calls) == 0 {
		return ""
	}
	last := calls[len(calls)-1]
	return last.Controller + last.Relay
}

// registrations counts agent i's registrations with a controller.
func (r *relayCluster) registrations(t *testing.T, i int) int {
	t.Helper()
	return len(r.agentLogs(t, i, "registered with controller"))
}

// requireRelayed checks that the relayed agents' streams go through the
// relay and the other agent's straight to the controller.
func (r *relayCluster) requireRelayed(t *testing.T) {
	t.Helper()
	r.waitRelayStreams(t, len(relayedAgents))
	for i := range agentHosts {
		want := r.controllerAddr
		if slices.Contains(relayedAgents, i) {
			want = r.relayAddr
		}
		require.Equal(t, want, r.leader(t, i), "agent on %s", r.agentHost(i).Name)
	}
}

// waitAround waits until every relayed agent has registered anew, since
// it had registered before[i] times, with the controller itself.
func (r *relayCluster) waitAround(t *testing.T, before map[int]int, fault time.Time) {
	t.Helper()
	deadline := time.Now().Add(readyTimeout)
	for _, i := range relayedAgents {
		for r.leader(t, i) != r.controllerAddr || r.registrations(t, i) <= before[i] {
			r.requireRunning(t)
			if time.Now().After(deadline) {
				t.Fatalf("the agent on %s never registered with the controller directly within %s; it calls %q, registered %d times (%d before the fault)",
					r.agentHost(i).Name, readyTimeout, r.leader(t, i), r.registrations(t, i), before[i])
			}
			time.Sleep(pollEvery)
		}
		t.Logf("e2e: agent on %s registered with the controller directly %s after the fault", r.agentHost(i).Name, time.Since(fault).Round(time.Millisecond))
	}
}

// The relay is killed: its agents' streams end at once, they reach the
// controller directly, and the job trains on in the same generation.
func TestRelayKill(t *testing.T) {
	testRelayFault(t, "relay-kill", func(t *testing.T, r *relayCluster) {
		r.relayKilled = true
		require.NoError(t, r.relay.Stop(syscall.SIGKILL))
		<-r.relay.Exited()
		t.Logf("e2e: SIGKILLed the relay on %s", r.relayHost.Name)
	})
}

// The relay's host vanishes from the network, the relay still running: its
// agents' streams stall until their keepalive ends them, they go around
// the relay to the controller, and meanwhile their gossip peer vouches for
// them, so the job trains on in the same generation.
func TestRelayCut(t *testing.T) {
	testRelayFault(t, "relay-cut", func(t *testing.T, r *relayCluster) {
		require.NoError(t, r.net.CutLink(1))
		t.Logf("e2e: cut the link of the relay's host %s", r.relayHost.Name)
	}, func(t *testing.T, r *relayCluster) {
		// Silent to the controller for longer than the heartbeat timeout,
		// the relayed nodes were kept on their peer's word; that is what
		// this test exercises.
		log, err := os.ReadFile(r.controller.LogPath())
		require.NoError(t, err)
		for _, i := range relayedAgents {
			require.Regexp(t, `"msg":"node silent to the controller but reachable by its peers","node":"`+r.agentHost(i).Name+`"`, string(log))
		}
		// The relay, still running, lets go of the streams its agents
		// gave up: its keepalives, towards the controller and towards the
		// agents, end them.
		r.waitRelayStreams(t, 0)
	})
}

// testRelayFault runs a job on all three nodes, two of them behind the
// relay, injects fault once it trains, and checks that the relayed agents
// reach the controller directly, the direct one is not disturbed, and the
// job runs to the end in generation 1. after, if any, checks more once the
// agents are back.
func testRelayFault(t *testing.T, name string, fault func(t *testing.T, r *relayCluster), after ...func(t *testing.T, r *relayCluster)) {
	r := newRelayCluster(t)
	r.requireRelayed(t)
	job := faultJob(t, r.cluster, name, func(spec map[string]any) {
		// Every node, those behind the relay included, is in the job.
		spec["nodes"] = map[string]any{"min": agentHosts, "max": agentHosts}
		spec["command"] = []any{"train.py", "--steps", strconv.Itoa(relayJobSteps), "--step-time", faultStepTime,
			"--checkpoint-every", strconv.Itoa(checkpointEvery), "--tick"}
	})
	j := r.waitCheckpoint(t, job.Name, checkpointEvery)
	require.Len(t, j.Assignments, agentHosts)
	// Still true once the job trains: its messages take the same streams.
	r.requireRelayed(t)

	before := map[int]int{}
	for i := range agentHosts {
		before[i] = r.registrations(t, i)
	}
	begin := time.Now()
	fault(t, r)
	r.waitAround(t, before, begin)

	j = r.status(t, job.Name)
	require.Equal(t, "JOB_STATE_RUNNING", j.State, "reason: %s", j.Reason)
	require.EqualValues(t, 1, j.Generation, "the relay's failure restarted the job: %s", j.Reason)
	r.waitNodes(t, "BUSY in generation 1", func(nodes []nodeJSON) bool {
		for _, n := range nodes {
			if n.State != "NODE_STATE_BUSY" || n.Job != job.Name || n.Generation != 1 {
				return false
			}
		}
		return true
	})
	direct := 2 // the agent not in relayedAgents
	require.Equal(t, before[direct], r.registrations(t, direct), "the agent on %s, which does not use the relay, registered again", r.agentHost(direct).Name)
	require.Equal(t, r.controllerAddr, r.leader(t, direct))
	for _, check := range after {
		check(t, r)
	}

	j = r.waitJob(t, job.Name, "finished", func(j jobJSON) bool { return finished(j.State) })
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, "reason: %s", j.Reason)
	require.EqualValues(t, 1, j.Generation, "the job never restarted")
	require.Zero(t, j.Restarts)
	kinds := eventKinds(r.jobEvents(t, job.Name))
	require.NotContains(t, kinds, "attempt_failed")
	require.NotContains(t, kinds, "node_lost")
	// Every rank trained every step in generation 1, through the fault.
	for i := range agentHosts {
		ticks := parseTicks(t, r.agentHost(i).Name, r.nodeLog(t, i, job.Name))
		require.NotEmpty(t, ticks, "no step on %s", r.agentHost(i).Name)
		last := map[int]int{}
		for _, tk := range ticks {
			require.EqualValues(t, 1, tk.generation, "%s rank %d step %d", tk.node, tk.rank, tk.step)
			require.Equal(t, last[tk.rank]+1, tk.step, "%s rank %d skipped or redid a step", tk.node, tk.rank)
			last[tk.rank] = tk.step
		}
		for rank, step := range last {
			require.Equal(t, relayJobSteps, step, "%s rank %d stopped training at step %d", r.agentHost(i).Name, rank, step)
		}
	}
	r.requireWorkersGone(t, job.Name, nil)
	t.Logf("e2e: job %s succeeded in generation 1, %s after the fault", job.Name, time.Since(begin).Round(time.Millisecond))
}
