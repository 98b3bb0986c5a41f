package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/rdzv/rdzv/test/netns"
)

const (
	procsPerNode = 2
	worldSize    = agentHosts * procsPerNode
	trainSteps   = 40
	// train.py's default --checkpoint-every.
	checkpointEvery = 20
)

// jobFile is examples/job.yaml adapted to the test cluster.
type jobFile struct {
	Name    string
	Path    string
	CkptDir string
	data    []byte
	// warm is set by faultJob for a job with launcher.kind warm.
	warm bool
}

// writeJob derives the job from examples/job.yaml, so that the shipped
// example is what gets exercised: exactly three nodes with two workers each,
// the example's script and launcher flags, and everything it writes kept
// under dir. edits then change the spec further.
func writeJob(t *testing.T, dir string, edits ...func(spec map[string]any)) jobFile {
	t.Helper()
	examples, err := filepath.Abs(filepath.Join("..", "..", "examples"))
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(examples, "job.yaml"))
	require.NoError(t, err)
	spec := map[string]any{}
	require.NoError(t, yaml.Unmarshal(data, &spec))

	name, _ := spec["name"].(string)
	require.NotEmpty(t, name, "examples/job.yaml has no name")
	job := jobFile{Name: name, Path: filepath.Join(dir, "job.yaml"), CkptDir: filepath.Join(dir, "ckpt")}
	spec["nodes"] = map[string]any{"min": agentHosts, "max": agentHosts}
	spec["procs_per_node"] = procsPerNode
	spec["workdir"] = examples
	spec["checkpoint"] = map[string]any{"dir": job.CkptDir}
	spec["command"] = []any{"train.py", "--steps", strconv.Itoa(trainSteps)}
	rendezvous, ok := spec["rendezvous"].(map[string]any)
	require.True(t, ok, "examples/job.yaml has no rendezvous section")
	// Every node is up before the job is submitted; waiting longer for a
	// fourth that does not exist only slows the test.
	rendezvous["last_call"] = "1s"
	env, _ := spec["env"].(map[string]any)
	if env == nil {
		env = map[string]any{}
		spec["env"] = env
	}
	env["OMP_NUM_THREADS"] = "1"
	// The workdir is the source tree, and workers get none of the test's
	// environment: Python must be told not to cache bytecode there.
	env["PYTHONDONTWRITEBYTECODE"] = "1"
	launcher, ok := spec["launcher"].(map[string]any)
	require.True(t, ok, "examples/job.yaml has no launcher section")
	extra, _ := launcher["extra_args"].([]any)
	i := slices.Index(extra, any("--log_dir"))
	require.True(t, i >= 0 && i+1 < len(extra), "examples/job.yaml launcher.extra_args has no --log_dir DIR: %v", extra)
	// torchrun refuses a log directory that is not empty, so it must be
	// this run's own.
	extra[i+1] = filepath.Join(dir, "torchrun-logs")
	for _, edit := range edits {
		edit(spec)
	}

	job.data, err = yaml.Marshal(spec)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(job.Path, job.data, 0o644))
	return job
}

// pythonModule runs the job with launcher.kind python-module: Debian's
// python3 -m torch.distributed.run, with the example's torchrun options.
func pythonModule(spec map[string]any) {
	launcher := spec["launcher"].(map[string]any)
	delete(launcher, "torchrun")
	launcher["kind"] = "python-module"
	launcher["python"] = "python3"
	launcher["module"] = "torch.distributed.run"
}

// warmLauncher runs the job with launcher.kind warm: standbys of Debian's
// python3 with torch imported, the workers forked from them.
func warmLauncher(spec map[string]any) {
	spec["launcher"] = map[string]any{"kind": "warm", "python": "/usr/bin/python3"}
}

// variant writes a copy of the job named name, changed by edit.
func (j jobFile) variant(t *testing.T, name string, edit func(spec map[string]any)) string {
	t.Helper()
	spec := map[string]any{}
	require.NoError(t, yaml.Unmarshal(j.data, &spec))
	spec["name"] = name
	edit(spec)
	data, err := yaml.Marshal(spec)
	require.NoError(t, err)
	path := filepath.Join(filepath.Dir(j.Path), name+".yaml")
	require.NoError(t, os.WriteFile(path, data, 0o644))
	return path
}

// trainAndVerify waits for the agents, runs the job to completion with
// `rdzvctl start --wait` and checks what every operator-facing view says
// about it. It returns the job and its events. edits change the job (see
// writeJob).
func trainAndVerify(t *testing.T, c *cluster, edits ...func(spec map[string]any)) (jobFile, []eventJSON) {
	t.Helper()
	begin := time.Now()
	nodes := c.waitReady(t)
	t.Logf("e2e: %d agents ready %s after the daemons started", len(nodes), time.Since(begin).Round(time.Millisecond))
	requireNodeIdentity(t, c, nodes)

	job := writeJob(t, c.dir, edits...)
	c.job = job.Name
	begin = time.Now()
	r := c.ctlWith(jobTimeout, "--controller", c.controllerAddr, "start", "--wait", job.Path)
	require.NoError(t, r.err, "%s", r)
	t.Logf("e2e: rdzvctl start --wait returned after %s", time.Since(begin).Round(time.Millisecond))
	for _, want := range []string{"job " + job.Name + " submitted", "rendezvous_committed", "job_succeeded", "job " + job.Name + " succeeded"} {
		require.Contains(t, r.stdout, want, "%s", r)
	}

	var events []eventJSON
	t.Run("status", func(t *testing.T) { requireSucceeded(t, c, job) })
	t.Run("logs", func(t *testing.T) { requireWorkerLogs(t, c, job) })
	t.Run("events", func(t *testing.T) { events = requireJobEvents(t, c, job) })
	t.Run("nodes idle after the job", func(t *testing.T) { requireIdle(t, c) })
	t.Run("no worker left behind", func(t *testing.T) { requireOnlyAgents(t, c, nil) })
	t.Run("checkpoints", func(t *testing.T) {
		for step := checkpointEvery; step <= trainSteps; step += checkpointEvery {
			require.FileExists(t, filepath.Join(job.CkptDir, fmt.Sprintf("step-%d", step), "COMPLETE"))
		}
	})
	return job, events
}

// requireNodeIdentity checks that each agent named itself after its host
// and advertises the address other hosts reach it on: eth0, never loopback,
// which is the wrong-interface mistake rdzv exists to prevent.
func requireNodeIdentity(t *testing.T, c *cluster, nodes []nodeJSON) {
	t.Helper()
	for i, n := range nodes {
		h := c.agentHost(i)
		require.Equal(t, h.Name, n.Info.Name)
		require.Equal(t, "eth0", n.Info.NcclInterface, "node %s: %s", n.Info.Name, n.Info.NcclInterfaceReason)
		require.Equal(t, h.IP, n.Info.Address, "node %s", n.Info.Name)
		require.False(t, strings.HasPrefix(n.Info.Address, "127."), "node %s advertises loopback", n.Info.Name)
		require.Empty(t, n.Info.Gpus, "node %s: a CPU host reported GPUs", n.Info.Name)
	}
}

// requireSucceeded checks `rdzvctl status`: one generation on h1, h2, h3,
// ranked by name, rank 0 (h1) the master, every worker exited 0.
func requireSucceeded(t *testing.T, c *cluster, job jobFile) jobJSON {
	t.Helper()
	var j jobJSON
	c.ctlJSON(t, &j, "status", job.Name)
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, "reason: %s", j.Reason)
	require.Equal(t, job.Name, j.Spec.Name)
	require.Equal(t, procsPerNode, j.Spec.ProcsPerNode)
	require.EqualValues(t, 1, j.Generation)
	require.Equal(t, c.agentHost(0).IP, j.MasterAddr)
	// The controller's default master port range.
	require.True(t, j.MasterPort >= 29500 && j.MasterPort <= 29999, "master_port %d", j.MasterPort)
	require.Len(t, j.Assignments, agentHosts)
	for i, a := range j.Assignments {
		h := c.agentHost(i)
		require.Equal(t, h.Name, a.Node, "assignment %d", i)
		require.Equal(t, i, a.NodeRank, "node %s", a.Node)
		require.Equal(t, h.IP, a.Address, "node %s", a.Node)
		require.Equal(t, "eth0", a.NcclInterface, "node %s", a.Node)
		require.Equal(t, "WORKER_STATE_SUCCEEDED", a.State, "node %s: %s", a.Node, a.Message)
		require.NotNil(t, a.ExitCode, "node %s: no exit_code field", a.Node)
		require.Equal(t, 0, *a.ExitCode, "node %s", a.Node)
		require.NotNil(t, a.Signal, "node %s: no signal field", a.Node)
		require.Empty(t, *a.Signal, "node %s", a.Node)
	}
	require.False(t, j.CreatedAt.IsZero())
	require.False(t, j.StartedAt.Before(j.CreatedAt), "started %s before created %s", j.StartedAt, j.CreatedAt)
	require.True(t, j.FinishedAt.After(j.StartedAt), "finished %s, started %s", j.FinishedAt, j.StartedAt)
	return j
}

// requireWorkerLogs checks each node's output as `rdzvctl logs` relays it:
// the RDZV_WORKER and RDZV_DONE lines train.py prints show that torchrun ran
// the ranks rdzv assigned, that they formed one gloo group of six, and that
// training made progress.
func requireWorkerLogs(t *testing.T, c *cluster, job jobFile) {
	t.Helper()
	nodeOf := map[int]string{} // global rank -> node
	for i := range agentHosts {
		h := c.agentHost(i)
		out := c.ctlOK(t, "logs", job.Name, "--node", h.Name)
		onDisk, err := os.ReadFile(filepath.Join(c.stateDir(i), "logs", job.Name+".log"))
		require.NoError(t, err)
		require.Equal(t, string(onDisk), out, "rdzvctl logs --node %s differs from the log on the node", h.Name)

		// The helper warns of any report the agent refused, e.g. for want
		// of the report token.
		require.NotContains(t, out, "failed (not repeated)", "a worker's report to the agent failed on %s", h.Name)
		workers := taggedLines(out, "RDZV_WORKER")
		require.Len(t, workers, procsPerNode, "RDZV_WORKER lines on %s:\n%s", h.Name, out)
		ranks := map[int]bool{}
		for _, w := range workers {
			require.Equal(t, strconv.Itoa(i), w["node_rank"], "%s: %v", h.Name, w)
			require.Equal(t, strconv.Itoa(worldSize), w["world_size"], "%s: %v", h.Name, w)
			require.Equal(t, h.Name, w["node"], "%s: %v", h.Name, w)
			require.Equal(t, "1", w["generation"], "%s: %v", h.Name, w)
			require.Equal(t, job.Name, w["job"], "%s: %v", h.Name, w)
			rank := atoi(t, w["rank"])
			require.Equal(t, procsPerNode*i+atoi(t, w["local_rank"]), rank, "%s: %v", h.Name, w)
			other, dup := nodeOf[rank]
			require.False(t, dup, "rank %d on both %s and %s", rank, other, h.Name)
			nodeOf[rank] = h.Name
			ranks[rank] = true
		}

		done := taggedLines(out, "RDZV_DONE")
		require.Len(t, done, procsPerNode, "RDZV_DONE lines on %s:\n%s", h.Name, out)
		for _, d := range done {
			require.True(t, ranks[atoi(t, d["rank"])], "%s: RDZV_DONE of a rank that did not start here: %v", h.Name, d)
			require.Equal(t, strconv.Itoa(trainSteps), d["steps"], "%s: %v", h.Name, d)
			first, err := strconv.ParseFloat(d["first_loss"], 64)
			require.NoError(t, err, "%s: %v", h.Name, d)
			final, err := strconv.ParseFloat(d["final_loss"], 64)
			require.NoError(t, err, "%s: %v", h.Name, d)
			require.Less(t, final, first, "%s: loss did not decrease: %v", h.Name, d)
		}
		require.Contains(t, out, "=== rdzv: generation 1 ended: WORKER_STATE_SUCCEEDED exit_code=0")
	}
	for rank := range worldSize {
		require.Contains(t, nodeOf, rank, "rank %d never started", rank)
	}
	require.Len(t, nodeOf, worldSize)
}

// taggedLines returns the key=value fields of each line holding tag.
// torchrun may prefix a worker's lines, so the tag need not start the line.
func taggedLines(out, tag string) []map[string]string {
	var found []map[string]string
	for _, line := range strings.Split(out, "\n") {
		i := strings.Index(line, tag+" ")
		if i < 0 {
			continue
		}
		fields := map[string]string{}
		for _, f := range strings.Fields(line[i+len(tag):]) {
			if k, v, ok := strings.Cut(f, "="); ok {
				fields[k] = v
			}
		}
		found = append(found, fields)
	}
	return found
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}

// requireJobEvents checks the job's event log in both output formats: one
// submission, one committed round, one event when every node's workers
// run and one when every node's have exited (none per node), the two
// checkpoints train.py saves (steps 20 and 40, reported from node rank 0),
// success, in time order. It returns the events.
func requireJobEvents(t *testing.T, c *cluster, job jobFile) []eventJSON {
	t.Helper()
	events := c.jobEvents(t, job.Name)
	kinds := eventKinds(events)
	t.Logf("e2e: events of %s: %v", job.Name, kinds)

	require.Len(t, events, 7, "events: %v", kinds)
	require.Equal(t, "job_submitted", events[0].Kind)
	require.Equal(t, "rendezvous_committed", events[1].Kind)
	require.EqualValues(t, 1, events[1].Generation)
	require.Contains(t, events[1].Message, c.agentHost(0).IP, "the committed round names its master")
	require.Equal(t, "job_succeeded", events[len(events)-1].Kind)
	phases := map[string]int{}
	var checkpoints []string
	for i, ev := range events {
		require.Equal(t, job.Name, ev.Job, "event %d", i)
		if i > 0 {
			require.False(t, ev.Time.Before(events[i-1].Time), "event %d (%s) is older than the one before it", i, ev.Kind)
		}
		switch ev.Kind {
		case "workers_running", "workers_exited":
			require.NotContains(t, phases, ev.Kind, "second %s", ev.Kind)
			require.EqualValues(t, 1, ev.Generation, ev.Kind)
			require.Empty(t, ev.Node, "%s is the generation's, not a node's", ev.Kind)
			phases[ev.Kind] = i
		case "checkpoint_recorded":
			require.Equal(t, c.agentHost(0).Name, ev.Node, "node rank 0 reports checkpoints")
			checkpoints = append(checkpoints, ev.Message)
		}
	}
	require.Len(t, checkpoints, 2, "one event per complete checkpoint")
	require.Contains(t, checkpoints[0], "checkpoint step 20 complete")
	require.Contains(t, checkpoints[1], "checkpoint step 40 complete")
	require.Contains(t, phases, "workers_running", "events: %v", kinds)
	require.Contains(t, phases, "workers_exited", "events: %v", kinds)
	require.Less(t, phases["workers_running"], phases["workers_exited"], "exited before every worker ran")
	require.Equal(t, fmt.Sprintf("generation 1: workers running on all %d nodes", agentHosts), events[phases["workers_running"]].Message)
	require.Equal(t, fmt.Sprintf("generation 1: workers exited on all %d nodes: %d succeeded", agentHosts, agentHosts), events[phases["workers_exited"]].Message)

	table := c.ctlOK(t, "events", job.Name)
	for _, kind := range []string{"job_submitted", "rendezvous_committed", "workers_running", "workers_exited", "job_succeeded"} {
		require.Contains(t, table, kind)
	}

	// Figures for the log, not assertions: they depend on the machine.
	t.Logf("e2e: submitted to rendezvous_committed: %s; committed to job_succeeded: %s",
		events[1].Time.Sub(events[0].Time).Round(time.Millisecond),
		events[len(events)-1].Time.Sub(events[1].Time).Round(time.Millisecond))
	return events
}

// jobEvents is `rdzvctl events JOB -o json`, oldest first.
func (c *cluster) jobEvents(t *testing.T, job string) []eventJSON {
	t.Helper()
	var resp struct {
		Events []eventJSON `json:"events"`
	}
	c.ctlJSON(t, &resp, "events", job)
	return resp.Events
}

func eventKinds(events []eventJSON) []string {
	kinds := make([]string, len(events))
	for i, ev := range events {
		kinds[i] = ev.Kind
	}
	return kinds
}

// requireIdle checks that a finished job released its nodes; those whose
// agent the test killed must be lost.
func requireIdle(t *testing.T, c *cluster) {
	t.Helper()
	nodes, err := c.nodes()
	require.NoError(t, err)
	require.Len(t, nodes, c.hosts)
	for i, n := range nodes {
		require.Equal(t, c.agentHost(i).Name, n.Info.Name)
		want := "NODE_STATE_READY"
		if c.killed[i] {
			want = "NODE_STATE_LOST"
		}
		require.Equal(t, want, n.State, "node %s", n.Info.Name)
		require.Empty(t, n.Job, "node %s", n.Info.Name)
		require.Zero(t, n.Generation, "node %s", n.Info.Name)
	}
}

// requireOnlyAgents checks that nothing but the agent runs on each agent
// host: the agent sweeps a job's process group before it reports the
// workers' exit, so no torchrun or python may outlive the job. On a host
// whose processes the test killed, nothing may run at all. spare, unless
// nil, names processes that may be left (see lingeringStandby).
func requireOnlyAgents(t *testing.T, c *cluster, spare func(pid int) bool) {
	t.Helper()
	for i, agent := range c.agents {
		h := c.agentHost(i)
		var others []string
		agentSeen := false
		// A process that has just exited (a dropped standby, a reparented
		// child) may still be listed, or be a zombie its parent reaps a
		// moment later: it must be gone within reapWait, not at the instant
		// of the first look.
		require.Eventually(t, func() bool {
			others, agentSeen = nil, false
			for _, pid := range netnsPids(t, h) {
				if pid == agent.Pid() && !c.killed[i] {
					agentSeen = true
					continue
				}
				if spare != nil && spare(pid) || procStatus(pid, "State") == "" {
					continue
				}
				others = append(others, fmt.Sprintf("%d (%s): %s", pid, procStatus(pid, "State"), strings.Join(procCmdline(pid), " ")))
			}
			return len(others) == 0
		}, reapWait, 50*time.Millisecond, "processes left on %s besides the agent: %q", h.Name, &others)
		require.True(t, agentSeen || c.killed[i], "agent (pid %d) not found in %s", agent.Pid(), h.NS)
	}
}

// reapWait is how long a process that has exited may still be listed.
const reapWait = 3 * time.Second

// netnsPids lists the processes in h's network namespace.
func netnsPids(t *testing.T, h *netns.Host) []int {
	t.Helper()
	out, err := exec.Command("ip", "netns", "pids", h.NS).Output()
	require.NoError(t, err)
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		pids = append(pids, atoi(t, f))
	}
	return pids
}

// procCmdline is a process's argv, empty once it has exited.
func procCmdline(pid int) []string {
	data, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
}
