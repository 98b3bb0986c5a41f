package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/test/netns"
)

// Controller HA end to end: a three-member etcd cluster (Debian's etcd) on
// h0..h2, controller replicas on h0 and h1, agents on h3..h5, real torchrun.

const (
	etcdMembers = 3
	// haLeaseTTL is the controllers' leader lease: a killed leader is
	// replaced within about this long.
	haLeaseTTL = "3s"
	// haJobSteps keeps the first job training through the failover and the
	// etcd outages (about a minute and a half at faultStepTime).
	haJobSteps = 900
)

// haCluster is the replicated control plane's processes.
type haCluster struct {
	*cluster
	etcd        []*netns.Proc
	etcdArgs    [][]string
	controllers []*netns.Proc
	ctlArgs     [][]string
}

var leaderElected = regexp.MustCompile(`^controller (\S+) leads \(previous leader: (\S+)\)`)

func newHACluster(t *testing.T) *haCluster {
	t.Helper()
	if _, err := os.Stat(etcdBin); err != nil {
		netns.SkipOrFail(t, "e2e: %s is missing (apt-get install etcd-server)", etcdBin)
	}
	c := newClusterHosts(t, etcdMembers)
	c.heartbeatTimeout = faultHeartbeatTimeout
	c.agentArgs = []string{"--stop-grace", faultStopGrace}
	h := &haCluster{cluster: c}

	var initial, endpoints []string
	for i := range etcdMembers {
		ip := c.net.Host(i).IP
		initial = append(initial, fmt.Sprintf("e%d=http://%s:2380", i, ip))
		endpoints = append(endpoints, "http://"+ip+":2379")
	}
	for i := range etcdMembers {
		ip := c.net.Host(i).IP
		h.etcdArgs = append(h.etcdArgs, []string{etcdBin, "--name", fmt.Sprintf("e%d", i),
			"--data-dir", filepath.Join(c.dir, fmt.Sprintf("etcd-%d", i)),
			"--listen-client-urls", "http://" + ip + ":2379", "--advertise-client-urls", "http://" + ip + ":2379",
			"--listen-peer-urls", "http://" + ip + ":2380", "--initial-advertise-peer-urls", "http://" + ip + ":2380",
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new"})
		h.etcd = append(h.etcd, nil)
		h.startEtcd(i)
	}
	for _, ep := range endpoints {
		require.Eventually(t, func() bool {
			_, err := c.etcdGet(ep, "/")
			return err == nil
		}, readyTimeout, pollEvery, "etcd at %s never answered", ep)
	}

	var addrs []string
	for i := range 2 {
		addr := c.net.Host(i).IP + ":" + controllerPort
		addrs = append(addrs, addr)
		// Each replica's certificate names the address agents dial it by.
		name := fmt.Sprintf("rdzv-controller-%d", i)
		c.pki(t, "issue", "controller", name, "--ip", c.net.Host(i).IP, "--dir", c.pkiDir)
		h.ctlArgs = append(h.ctlArgs, append([]string{c.controllerBin, "--listen", addr, "--advertise-addr", addr,
			"--etcd-endpoints", strings.Join(endpoints, ","), "--heartbeat-timeout", c.heartbeatTimeout,
			"--leader-lease-ttl", haLeaseTTL}, append(c.tlsArgs("controller", name), c.secretsKeyArgs()...)...))
		h.controllers = append(h.controllers, nil)
	}
	c.controllerAddr = strings.Join(addrs, ",")
	h.startController(0)
	// h0's controller leads first: a fixed starting point for the test.
	h.waitLeader(t, addrs[0], time.Time{})
	h.startController(1)
	c.startAgents()
	c.waitReady(t)
	return h
}

// haJob submits a fault job (see faultJob) with its own checkpoint
// directory: several jobs run one after the other here, and none may find
// another's checkpoints.
func (h *haCluster) haJob(t *testing.T, name string, edit func(spec map[string]any)) jobFile {
	t.Helper()
	dir := filepath.Join(h.dir, "ckpt-"+name)
	job := faultJob(t, h.cluster, name, func(spec map[string]any) {
		spec["checkpoint"] = map[string]any{"dir": dir}
		if edit != nil {
			edit(spec)
		}
	})
	job.CkptDir = dir
	return job
}

func (h *haCluster) startEtcd(i int) {
	h.etcd[i] = h.net.Host(i).Start(h.t, "etcd", nil, h.etcdArgs[i]...)
}

func (h *haCluster) stopEtcd(t *testing.T, i int) {
	t.Helper()
	require.NoError(t, h.etcd[i].Stop(syscall.SIGTERM))
	select {
	case <-h.etcd[i].Exited():
	case <-time.After(stopTimeout):
		t.Fatalf("etcd on %s still running %s after SIGTERM", h.net.Host(i).Name, stopTimeout)
	}
}

func (h *haCluster) startController(i int) {
	h.controllers[i] = h.net.Host(i).Start(h.t, "controller", nil, h.ctlArgs[i]...)
	h.controller = h.controllers[i]
}

// killController SIGKILLs controller i, as a crash would.
func (h *haCluster) killController(t *testing.T, i int) {
	t.Helper()
	require.NoError(t, h.controllers[i].Stop(syscall.SIGKILL))
	<-h.controllers[i].Exited()
	h.controller = h.controllers[1-i]
}

// leaderAt reads the newest leader_elected event: who leads, and when it
// took over.
func (h *haCluster) leaderAt() (addr string, at time.Time, err error) {
	r := h.ctl("events", "-o", "json")
	if r.err != nil {
		return "", time.Time{}, fmt.Errorf("%s", r)
	}
	var resp struct {
		Events []eventJSON `json:"events"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &resp); err != nil {
		return "", time.Time{}, err
	}
	for i := len(resp.Events) - 1; i >= 0; i-- {
		if m := leaderElected.FindStringSubmatch(resp.Events[i].Message); resp.Events[i].Kind == "leader_elected" && m != nil {
			return m[1], resp.Events[i].Time, nil
		}
	}
	return "", time.Time{}, fmt.Errorf("no leader_elected event yet")
}

// waitLeader waits until addr leads, by an election after since, and
// returns when it took over.
func (h *haCluster) waitLeader(t *testing.T, addr string, since time.Time) time.Time {
	t.Helper()
	var at time.Time
	// EventuallyWithT reports the last poll's failures: the leader seen
	// last, or why none could be read.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got, when, err := h.leaderAt()
		if !assert.NoError(c, err) {
			return
		}
		if assert.Equal(c, addr, got, "leader") && assert.True(c, when.After(since), "%s's election at %s is not after %s", got, when, since) {
			at = when
		}
	}, readyTimeout, pollEvery, "%s never led", addr)
	return at
}

// lastStep is the newest training step in agent i's log of job, read from
// the file: it must show progress even while no controller answers.
func (h *haCluster) lastStep(t *testing.T, i int, job string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(h.stateDir(i), "logs", job+".log"))
	require.NoError(t, err)
	last := -1
	for _, tk := range parseTicks(t, h.agentHost(i).Name, string(data)) {
		last = max(last, tk.step)
	}
	return last
}

// requireTraining checks that agent i's workers of job are past step
// after a few seconds, and returns the step they reached.
func (h *haCluster) requireTraining(t *testing.T, i int, job string, after int, what string) int {
	t.Helper()
	var step int
	require.Eventually(t, func() bool {
		step = h.lastStep(t, i, job)
		return step > after
	}, 30*time.Second, pollEvery, "%s: %s stopped training at step %d", what, h.agentHost(i).Name, after)
	return step
}

func TestHAFailoverAndEtcdQuorum(t *testing.T) {
	h := newHACluster(t)
	// Deferred, so it reports while the daemons still run.
	defer h.report()
	addrs := strings.Split(h.controllerAddr, ",")
	job := h.haJob(t, "ha-train", func(spec map[string]any) {
		spec["command"] = []any{"train.py", "--steps", fmt.Sprint(haJobSteps), "--step-time", faultStepTime,
			"--checkpoint-every", fmt.Sprint(checkpointEvery), "--tick"}
	})
	h.waitCheckpoint(t, job.Name, checkpointEvery)
	step := h.lastStep(t, 0, job.Name)

	t.Run("kill -9 the leader", func(t *testing.T) {
		killed := time.Now()
		h.killController(t, 0)
		at := h.waitLeader(t, addrs[1], killed)
		t.Logf("e2e: FIGURE standby took the lead %s after the leader was killed (lease TTL %s)", at.Sub(killed).Round(time.Millisecond), haLeaseTTL)
		j := h.waitJob(t, job.Name, "reported by the new leader as running", func(j jobJSON) bool { return j.State == "JOB_STATE_RUNNING" })
		require.EqualValues(t, 1, j.Generation, "the failover restarted the job: %s", j.Reason)
		step = h.requireTraining(t, 0, job.Name, step, "after the failover")
		// The killed controller comes back as the standby.
		h.startController(0)
	})

	t.Run("one etcd member down changes nothing", func(t *testing.T) {
		h.stopEtcd(t, 2)
		j := h.status(t, job.Name)
		require.EqualValues(t, 1, j.Generation)
		step = h.requireTraining(t, 1, job.Name, step, "with one etcd member down")
	})

	t.Run("etcd quorum lost: changes refused, training goes on", func(t *testing.T) {
		lost := time.Now()
		h.stopEtcd(t, 1)
		extra := writeJob(t, h.dir).variant(t, "ha-extra", func(spec map[string]any) {
			spec["nodes"] = map[string]any{"min": 1, "max": 1}
			spec["checkpoint"] = map[string]any{"dir": filepath.Join(h.dir, "ckpt-ha-extra")}
		})
		deadline := time.Now().Add(readyTimeout)
		for {
			// Long enough for the leader's write to time out in etcd.
			r := h.ctlWith(commandTimeout, "--controller", h.controllerAddr, "--timeout", "20s", "start", extra)
			require.NotZero(t, r.exitCode(), "a job was accepted without etcd quorum: %s", r)
			if strings.Contains(r.stderr, "etcd unavailable (no quorum?)") {
				t.Logf("e2e: without quorum rdzvctl start says: %s", strings.TrimSpace(r.stderr))
				break
			}
			require.True(t, time.Now().Before(deadline), "rdzvctl start never said etcd is unavailable; last: %s", r)
			time.Sleep(pollEvery)
		}
		// Long enough without any controller that a heartbeat timeout
		// would have fenced the workers; peers vouch for each other.
		for time.Since(lost) < 15*time.Second {
			time.Sleep(pollEvery)
		}
		for i := range agentHosts {
			step = h.requireTraining(t, i, job.Name, h.lastStep(t, i, job.Name), "without etcd quorum")
		}

		h.startEtcd(1)
		h.startEtcd(2)
		require.Eventually(t, func() bool {
			// An attempt may have been applied although its answer was
			// lost while etcd recovered: then the job exists already.
			r := h.ctl("start", extra)
			return r.err == nil || strings.Contains(r.stderr, "stop it before starting it again")
		}, readyTimeout, pollEvery, "no new job accepted after quorum returned")
		h.ctlOK(t, "stop", "ha-extra")
		t.Logf("e2e: jobs accepted again %s after quorum was lost", time.Since(lost).Round(time.Millisecond))
	})

	j := h.waitJob(t, job.Name, "finished", func(j jobJSON) bool { return finished(j.State) })
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, j.Reason)
	require.EqualValues(t, 1, j.Generation, "never restarted")
	require.Zero(t, j.Restarts)
	require.NotContains(t, eventKinds(h.jobEvents(t, job.Name)), "attempt_failed")
	h.waitNodes(t, "idle", func(nodes []nodeJSON) bool {
		for _, n := range nodes {
			if n.State != "NODE_STATE_READY" {
				return false
			}
		}
		return true
	})

	t.Run("a node dies during a failover", func(t *testing.T) {
		leader, _, err := h.leaderAt()
		require.NoError(t, err)
		i := 0
		if leader == addrs[1] {
			i = 1
		}
		job := h.haJob(t, "ha-node-loss", nil)
		before := h.waitCheckpoint(t, job.Name, checkpointEvery)
		fault := time.Now()
		h.killController(t, i)
		h.killHost(t, 2)
		t.Logf("e2e: killed the leader %s and node %s", leader, h.agentHost(2).Name)
		h.waitLeader(t, addrs[1-i], fault)
		run := requireRecovered(t, h.cluster, job, fault, before)
		require.Equal(t, agentNames(h.cluster)[:2], run.rounds[2].nodes, "generation 2 runs on the nodes left")
	})
}
