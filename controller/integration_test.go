package controller_test

import (
	"errors"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rdzv/rdzv/agent/launchertest"
	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/controller/store"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const (
	pending   = rdzvv1.JobState_JOB_STATE_PENDING
	running   = rdzvv1.JobState_JOB_STATE_RUNNING
	stopping  = rdzvv1.JobState_JOB_STATE_STOPPING
	succeeded = rdzvv1.JobState_JOB_STATE_SUCCEEDED
	failed    = rdzvv1.JobState_JOB_STATE_FAILED
	stopped   = rdzvv1.JobState_JOB_STATE_STOPPED
)

// assigned lists a job's nodes, checking they come in rank order.
func assigned(t *testing.T, j *rdzvv1.Job) []string {
	t.Helper()
	var out []string
	for i, a := range j.GetAssignments() {
		require.EqualValues(t, i, a.GetNodeRank(), "assignments out of rank order")
		out = append(out, a.GetNode())
	}
	return out
}

func assignment(t *testing.T, j *rdzvv1.Job, node string) *rdzvv1.NodeAssignment {
	t.Helper()
	for _, a := range j.GetAssignments() {
		if a.GetNode() == node {
			return a
		}
	}
	require.FailNow(t, "node not assigned", "node %s in %v", node, assigned(t, j))
	return nil
}

func eventKinds(events []*rdzvv1.Event) []string {
	out := make([]string, len(events))
	for i, ev := range events {
		out[i] = ev.GetKind()
	}
	return out
}

func reasonContains(parts ...string) func(*rdzvv1.Job) bool {
	return func(j *rdzvv1.Job) bool {
		for _, p := range parts {
			if !strings.Contains(j.GetReason(), p) {
				return false
			}
		}
		return true
	}
}

func TestJobRunsToSuccess(t *testing.T) {
	c := newCluster(t)
	// Registered out of name order: ranks must not depend on it.
	c.addAgent("node-b", 4, nil)
	c.addAgent("node-a", 4, nil)

	spec := c.spec("train", 2, 2, "gate")
	spec.GpusPerNode = 2
	submitted := c.startJob(spec)
	require.Equal(t, pending, submitted.GetState())
	require.Zero(t, submitted.GetGeneration())
	require.EqualValues(t, 2, submitted.GetSpec().GetProcsPerNode(), "procs_per_node defaults to gpus_per_node")

	run := c.waitRunning("train")
	require.Equal(t, uint64(1), run.GetGeneration())
	require.Equal(t, []string{"node-a", "node-b"}, assigned(t, run))
	require.Equal(t, "127.0.0.1", run.GetMasterAddr())
	require.GreaterOrEqual(t, run.GetMasterPort(), uint32(masterPortMin))
	require.LessOrEqual(t, run.GetMasterPort(), uint32(masterPortMax))
	require.NotNil(t, run.GetStartedAt())

	nodes := c.listNodes()
	for rank, name := range []string{"node-a", "node-b"} {
		n := nodes[name]
		require.Equal(t, rdzvv1.NodeState_NODE_STATE_BUSY, n.GetState(), name)
		require.Equal(t, "train", n.GetJob())
		require.Equal(t, uint64(1), n.GetGeneration())

		a := assignment(t, run, name)
		require.Equal(t, []uint32{0, 1}, a.GetGpuIndices())
		require.Equal(t, "lo", a.GetNcclInterface())

		rec := c.record("train", name, 1)
		require.Equal(t, []string{
			"--nnodes", "2", "--node_rank", strconv.Itoa(rank), "--nproc_per_node", "2",
			"--master_addr", "127.0.0.1", "--master_port", strconv.Itoa(int(run.GetMasterPort())),
			"train.py", "gate",
		}, rec.Args, name)
		reportAddr, err := netip.ParseAddrPort(rec.Env["RDZV_AGENT_ADDR"])
		require.NoError(t, err, "workers get the agent's report endpoint")
		require.True(t, reportAddr.Addr().IsLoopback(), "the report endpoint is local only: %s", reportAddr)
		delete(rec.Env, "RDZV_AGENT_ADDR")
		require.Regexp(t, "^[0-9a-f]{64}$", rec.Env["RDZV_REPORT_TOKEN"], "workers get their generation's report token")
		delete(rec.Env, "RDZV_REPORT_TOKEN")
		require.Equal(t, map[string]string{
			"GLOO_SOCKET_IFNAME":         "lo",
			"NCCL_SOCKET_IFNAME":         "lo",
			"CUDA_VISIBLE_DEVICES":       "0,1",
			"RDZV_JOB":                   "train",
			"RDZV_GENERATION":            "1",
			"RDZV_NODE":                  name,
			"RDZV_NODE_RANK":             strconv.Itoa(rank),
			"RDZV_CHECKPOINT_DIR":        "",
			"RDZV_RESUME_FROM":           "",
			"RDZV_MEMCKPT_DIR":           "",
			"RDZV_RESUME_MEMORY":         "",
			"RDZV_RESUME_MEMORY_WORLD":   "",
			"RDZV_MEMCKPT_PERSIST_EVERY": "",
			"RDZV_NNODES":                "2",
			"RDZV_PROCS_PER_NODE":        "2",
			"JOB_VAR":                    "from-job",
		}, rec.Env, name)
	}

	c.release("train")
	done := c.waitJobState("train", succeeded)
	require.Equal(t, uint64(1), done.GetGeneration())
	require.Equal(t, "all 2 nodes finished", done.GetReason())
	require.NotNil(t, done.GetFinishedAt())
	for _, a := range done.GetAssignments() {
		require.Equal(t, rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED, a.GetState(), a.GetNode())
		require.Zero(t, a.GetExitCode())
	}
	c.waitIdle("node-a", "node-b")

	kinds := eventKinds(c.events("train"))
	require.Equal(t, "job_submitted", kinds[0], kinds)
	require.Equal(t, "rendezvous_committed", kinds[1], kinds)
	require.Equal(t, "job_succeeded", kinds[len(kinds)-1], kinds)
	// One event per phase of the generation, none per node.
	require.Equal(t, []string{controller.EventWorkersRunning, controller.EventWorkersExited}, kinds[2:len(kinds)-1])
}

func TestWorkerFailureFailsJob(t *testing.T) {
	c := newCluster(t)
	c.addAgent("node-a", 0, nil)
	c.addAgent("node-b", 0, nil)

	c.startJob(c.spec("train", 2, 2, "fail-on", "node-b", "3"))
	survivor := c.record("train", "node-a", 1)

	j := c.waitJobState("train", failed)
	require.Contains(t, j.GetReason(), "node node-b (rank 1)")
	require.Contains(t, j.GetReason(), "exited with code 3")
	b := assignment(t, j, "node-b")
	require.Equal(t, rdzvv1.WorkerState_WORKER_STATE_FAILED, b.GetState())
	require.EqualValues(t, 3, b.GetExitCode())

	// The healthy node's workers are stopped, not left running.
	c.waitGroupGone(survivor.PID)
	j = c.waitJob("train", func(j *rdzvv1.Job) bool {
		return assignment(t, j, "node-a").GetState() == rdzvv1.WorkerState_WORKER_STATE_STOPPED
	})
	require.Equal(t, failed, j.GetState(), "the stopped survivor must not change the outcome")
	c.waitIdle("node-a", "node-b")
	exited := c.waitEvent("train", controller.EventWorkersExited)
	require.Equal(t, "generation 1: workers exited on all 2 nodes: 1 stopped, 1 failed (listed in worker_failed events)", exited.GetMessage())
	var failures []string
	for _, ev := range c.events("train") {
		if ev.GetKind() == controller.EventWorkerFailed {
			failures = append(failures, ev.GetNode()+": "+ev.GetMessage())
		}
	}
	require.Equal(t, []string{"node-b: workers on node-b exited with code 3"}, failures, "the failure alone is listed, not the stopped survivor")
	require.Contains(t, eventKinds(c.events("train")), "job_failed")
}

func TestPendingUntilMinNodes(t *testing.T) {
	c := newCluster(t)
	c.addAgent("node-a", 0, nil)
	c.addAgent("node-b", 0, nil)

	c.startJob(c.spec("train", 3, 3, "ok"))
	j := c.waitJob("train", reasonContains("2 of 2 nodes eligible, need 3"))
	require.Equal(t, pending, j.GetState())
	require.Empty(t, j.GetAssignments())
	require.False(t, c.hasRecord("train", "node-a", 1))

	c.addAgent("node-c", 0, nil)
	j = c.waitJobState("train", succeeded)
	require.Equal(t, []string{"node-a", "node-b", "node-c"}, assigned(t, j))
}

func TestAtMostMaxNodes(t *testing.T) {
	c := newCluster(t)
	for _, n := range []string{"node-c", "node-a", "node-b"} {
		c.addAgent(n, 0, nil)
	}
	c.startJob(c.spec("train", 1, 2, "ok"))
	j := c.waitJobState("train", succeeded)
	require.Equal(t, []string{"node-a", "node-b"}, assigned(t, j))
	require.Equal(t, "2", c.record("train", "node-b", 1).Arg("--nnodes"))
	require.False(t, c.hasRecord("train", "node-c", 1), "a node beyond max ran the job")
}

func TestLastCallWaitsForMoreNodes(t *testing.T) {
	c := newCluster(t)
	c.addAgent("node-a", 0, nil)

	spec := c.spec("train", 1, 3, "ok")
	spec.RendezvousLastCall = durationpb.New(2 * time.Second)
	c.startJob(spec)
	j := c.waitJob("train", reasonContains("last call"))
	require.Equal(t, pending, j.GetState())

	c.addAgent("node-b", 0, nil)
	j = c.waitJobState("train", succeeded)
	require.Equal(t, []string{"node-a", "node-b"}, assigned(t, j), "a node that joined during the last call was left out")
	require.Equal(t, "2", c.record("train", "node-a", 1).Arg("--nnodes"))
}

func TestSelectorAndGPUs(t *testing.T) {
	c := newCluster(t)
	c.addAgent("small", 2, map[string]string{"pool": "train"})
	c.addAgent("big", 8, map[string]string{"pool": "train"})
	c.addAgent("infer", 8, map[string]string{"pool": "infer"})

	tests := []struct {
		name     string
		selector map[string]string
		gpus     uint32
		want     []string
		// wantReason is what a job nothing can run says while pending.
		wantReason []string
	}{
		{name: "selector and gpus", selector: map[string]string{"pool": "train"}, gpus: 4, want: []string{"big"}},
		{name: "selector only", selector: map[string]string{"pool": "train"}, want: []string{"big", "small"}},
		{name: "gpus only", gpus: 8, want: []string{"big", "infer"}},
		{name: "no node matches the selector", selector: map[string]string{"pool": "none"},
			wantReason: []string{"0 of 3 nodes eligible", "matching pool=none", "3 not matching the selector"}},
		{name: "no node has enough gpus", gpus: 16,
			wantReason: []string{"0 of 3 nodes eligible", "with 16 GPUs", "3 with too few GPUs"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := "job-" + strconv.Itoa(i)
			spec := c.spec(name, 1, 3, "ok")
			spec.Selector, spec.GpusPerNode = tt.selector, tt.gpus
			c.startJob(spec)
			if tt.want == nil {
				j := c.waitJob(name, reasonContains(tt.wantReason...))
				require.Equal(t, pending, j.GetState())
				require.Equal(t, stopped, c.stopJob(name).GetState())
				return
			}
			j := c.waitJobState(name, succeeded)
			require.Equal(t, tt.want, assigned(t, j))
			for _, n := range tt.want {
				var gpus []string
				for g := range tt.gpus {
					gpus = append(gpus, strconv.Itoa(int(g)))
				}
				require.Equal(t, strings.Join(gpus, ","), c.record(name, n, 1).Env["CUDA_VISIBLE_DEVICES"], n)
			}
			c.waitIdle("small", "big", "infer")
		})
	}
}

func TestOneJobPerNode(t *testing.T) {
	c := newCluster(t)
	c.addAgent("node-a", 0, nil)
	c.addAgent("node-b", 0, nil)

	c.startJob(c.spec("first", 2, 2, "gate"))
	c.waitRunning("first")
	c.startJob(c.spec("second", 2, 2, "ok"))
	j := c.waitJob("second", reasonContains("0 of 2 nodes eligible", "2 busy or not ready"))
	require.Equal(t, pending, j.GetState())
	require.False(t, c.hasRecord("second", "node-a", 1))

	c.release("first")
	first := c.waitJobState("first", succeeded)
	second := c.waitJobState("second", succeeded)
	require.Equal(t, []string{"node-a", "node-b"}, assigned(t, second))
	require.False(t, second.GetStartedAt().AsTime().Before(first.GetFinishedAt().AsTime()),
		"second started at %s, before first finished at %s", second.GetStartedAt().AsTime(), first.GetFinishedAt().AsTime())
}

func TestStopJob(t *testing.T) {
	c := newCluster(t)
	c.addAgent("node-a", 0, nil)
	c.addAgent("node-b", 0, nil)

	t.Run("running", func(t *testing.T) {
		c.startJob(c.spec("running", 2, 2, "hang"))
		c.waitRunning("running")
		recs := []launchertest.Record{c.record("running", "node-a", 1), c.record("running", "node-b", 1)}

		require.Equal(t, stopping, c.stopJob("running").GetState())
		j := c.waitJobState("running", stopped)
		require.Equal(t, "stopped by operator", j.GetReason())
		for _, a := range j.GetAssignments() {
			require.Equal(t, rdzvv1.WorkerState_WORKER_STATE_STOPPED, a.GetState(), a.GetNode())
			require.Equal(t, "SIGTERM", a.GetSignal(), a.GetNode())
		}
		for _, r := range recs {
			c.waitGroupGone(r.PID)
		}
		c.waitIdle("node-a", "node-b")
		kinds := eventKinds(c.events("running"))
		require.Equal(t, []string{"job_stopping", "job_stopped"}, slices.DeleteFunc(kinds, func(k string) bool {
			return k != "job_stopping" && k != "job_stopped"
		}))
		// Stopping a finished job changes nothing.
		require.Equal(t, stopped, c.stopJob("running").GetState())
	})

	t.Run("pending", func(t *testing.T) {
		c.startJob(c.spec("pending", 5, 5, "ok"))
		j := c.stopJob("pending")
		require.Equal(t, stopped, j.GetState())
		require.Contains(t, j.GetReason(), "before it started")
		require.Equal(t, stopped, c.getJob("pending").GetState())
		require.Zero(t, c.getJob("pending").GetGeneration())
	})

	t.Run("unknown", func(t *testing.T) {
		_, err := c.jobs.StopJob(rpcCtx(t), &rdzvv1.StopJobRequest{Name: "ghost"})
		require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	})
}

func TestRendezvousTimeout(t *testing.T) {
	c := newCluster(t)
	c.addAgent("node-a", 0, nil)
	spec := c.spec("train", 5, 5, "ok")
	spec.RendezvousTimeout = durationpb.New(time.Second)
	c.startJob(spec)
	j := c.waitJobState("train", failed)
	require.Contains(t, j.GetReason(), "rendezvous timed out")
	require.Contains(t, j.GetReason(), "1 of 1 nodes eligible, need 5")
	require.Zero(t, j.GetGeneration())
	require.False(t, c.hasRecord("train", "node-a", 1))
	c.waitIdle("node-a")
}

// TestStoppedAgentIsLost stops an agent in the middle of a job. It reports
// its workers stopped on the way out, which fails the job at once; its node
// is declared lost when its heartbeats stop. TestSilentNodeIsLost covers a
// node that says nothing.
func TestStoppedAgentIsLost(t *testing.T) {
	c := newCluster(t)
	c.addAgent("node-a", 0, nil)
	lost := c.addAgent("node-b", 0, nil)

	c.startJob(c.spec("train", 2, 2, "hang"))
	c.waitRunning("train")
	recA, recB := c.record("train", "node-a", 1), c.record("train", "node-b", 1)

	lost.stop()
	require.True(t, groupGone(recB.PID), "a stopped agent leaves workers behind")
	j := c.waitJobState("train", failed)
	require.Equal(t, "node node-b (rank 1): workers killed by signal SIGTERM (agent shutting down); no restarts left (max_restarts 0)", j.GetReason())
	c.waitGroupGone(recA.PID)
	c.waitIdle("node-a")

	c.waitNode("node-b", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST })
	require.NotContains(t, eventKinds(c.events("train")), "node_lost", "the node had left the job before it was lost")
	var lostEvents []*rdzvv1.Event
	for _, ev := range c.events("") {
		if ev.GetKind() == "node_lost" {
			lostEvents = append(lostEvents, ev)
		}
	}
	require.Len(t, lostEvents, 1)
	require.Equal(t, "node-b", lostEvents[0].GetNode())

	// Back from the dead, it registers again and takes work.
	c.addAgent("node-b", 0, nil)
	c.startJob(c.spec("again", 2, 2, "ok"))
	require.Equal(t, []string{"node-a", "node-b"}, assigned(t, c.waitJobState("again", succeeded)))
}

func TestStartJobRejectsInvalidSpecs(t *testing.T) {
	c := newCluster(t)

	tests := []struct {
		name      string
		edit      func(*rdzvv1.JobSpec)
		wantField string
	}{
		{"min above max", func(s *rdzvv1.JobSpec) { s.NodesMin, s.NodesMax = 3, 2 }, "nodes.max"},
		{"no min", func(s *rdzvv1.JobSpec) { s.NodesMin, s.NodesMax = 0, 0 }, "nodes.min"},
		{"empty command", func(s *rdzvv1.JobSpec) { s.Command = nil }, "command"},
		{"bad name", func(s *rdzvv1.JobSpec) { s.Name = "Bad_Name" }, "name"},
		{"reserved rdzv env", func(s *rdzvv1.JobSpec) { s.Env = map[string]string{"RDZV_NODE": "x"} }, "env.RDZV_NODE"},
		{"reserved nccl env", func(s *rdzvv1.JobSpec) { s.Env = map[string]string{"NCCL_SOCKET_IFNAME": "eth0"} }, "env.NCCL_SOCKET_IFNAME"},
		{"launcher flag", func(s *rdzvv1.JobSpec) { s.LauncherExtraArgs = []string{"--master_port=1"} }, "launcher.extra_args[0]"},
		{"relative workdir", func(s *rdzvv1.JobSpec) { s.Workdir = "rel" }, "workdir"},
		{"negative timeout", func(s *rdzvv1.JobSpec) { s.RendezvousTimeout = durationpb.New(-time.Second) }, "rendezvous.timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := c.spec("valid-name", 1, 1, "ok")
			tt.edit(spec)
			_, err := c.jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: spec})
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tt.wantField+":")
		})
	}
	t.Run("no spec", func(t *testing.T) {
		_, err := c.jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		require.Contains(t, status.Convert(err).Message(), "spec")
	})
	require.Empty(t, c.listJobs())
	require.Empty(t, c.etcdKeys(store.JobsPrefix()), "a rejected job was stored")
	require.Empty(t, c.etcdKeys(store.EventsPrefix("valid-name")))

	t.Run("other calls", func(t *testing.T) {
		tests := []struct {
			name string
			call func() error
			want codes.Code
		}{
			{"get unknown job", func() error {
				_, err := c.jobs.GetJob(rpcCtx(t), &rdzvv1.GetJobRequest{Name: "ghost"})
				return err
			}, codes.NotFound},
			{"get invalid name", func() error {
				_, err := c.jobs.GetJob(rpcCtx(t), &rdzvv1.GetJobRequest{Name: "Not/A/Name"})
				return err
			}, codes.InvalidArgument},
			{"stop invalid name", func() error {
				_, err := c.jobs.StopJob(rpcCtx(t), &rdzvv1.StopJobRequest{Name: ""})
				return err
			}, codes.InvalidArgument},
			{"events of an invalid job name", func() error {
				_, err := c.jobs.ListEvents(rpcCtx(t), &rdzvv1.ListEventsRequest{Job: "_cluster"})
				return err
			}, codes.InvalidArgument},
			{"too many events", func() error {
				_, err := c.jobs.ListEvents(rpcCtx(t), &rdzvv1.ListEventsRequest{Limit: 10001})
				return err
			}, codes.InvalidArgument},
		}
		for _, tt := range tests {
			err := tt.call()
			require.Equal(t, tt.want, status.Code(err), "%s: %v", tt.name, err)
		}
	})

	t.Run("duplicate name", func(t *testing.T) {
		c.addAgent("node-a", 0, nil)
		c.startJob(c.spec("dup", 1, 1, "gate"))
		c.waitRunning("dup")
		_, err := c.jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: c.spec("dup", 1, 1, "ok")})
		require.Equal(t, codes.AlreadyExists, status.Code(err), "%v", err)
		require.Equal(t, []string{"gate"}, c.getJob("dup").GetSpec().GetCommand()[1:], "the running job was replaced")

		c.startJob(c.spec("dup-pending", 5, 5, "ok"))
		_, err = c.jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: c.spec("dup-pending", 5, 5, "ok")})
		require.Equal(t, codes.AlreadyExists, status.Code(err), "%v", err)
		c.release("dup")
		c.waitJobState("dup", succeeded)
	})
}

// TestRerunFinishedJob starts a job again under the name of one that
// finished: the new run replaces it and its generations carry on, so no
// late report from the old run can be taken for the new one.
func TestRerunFinishedJob(t *testing.T) {
	c := newCluster(t)
	c.addAgent("node-a", 0, nil)
	c.startJob(c.spec("train", 1, 1, "exit", "4"))
	c.waitJobState("train", failed)

	_, err := c.jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: c.spec("train", 1, 1, "ok")})
	require.NoError(t, err)
	j := c.waitJobState("train", succeeded)
	require.Equal(t, uint64(2), j.GetGeneration())
	require.Equal(t, "2", c.record("train", "node-a", 2).Env["RDZV_GENERATION"])
	require.Equal(t, "job_submitted", eventKinds(c.events("train"))[0], "the old run's events are dropped")
}

func TestControllerRestart(t *testing.T) {
	// Agents retry with a backoff that can exceed a short heartbeat timeout;
	// this test is about what survives a restart, not about liveness.
	c := newCluster(t, func(cfg *controller.Config) { cfg.Heartbeat.Timeout.Duration = time.Minute })
	c.addAgent("node-a", 2, map[string]string{"pool": "train"})
	c.addAgent("node-b", 2, nil)
	c.startJob(c.spec("before", 2, 2, "ok"))
	before := c.waitJobState("before", succeeded)
	c.waitIdle("node-a", "node-b")
	c.startJob(c.spec("during", 2, 2, "gate"))
	c.waitRunning("during")

	c.stopController()
	// A worker that finishes while no controller listens is reported when
	// its agent registers with the next one.
	c.release("during")
	c.waitGroupGone(c.record("during", "node-a", 1).PID)
	c.waitGroupGone(c.record("during", "node-b", 1).PID)
	restarted := time.Now()
	c.startController()

	jobs := c.listJobs()
	require.Len(t, jobs, 2)
	require.Equal(t, "before", jobs[0].GetSpec().GetName())
	require.Equal(t, succeeded, jobs[0].GetState())
	require.Equal(t, before.GetGeneration(), jobs[0].GetGeneration())
	require.Equal(t, before.GetMasterPort(), jobs[0].GetMasterPort())
	require.Equal(t, []string{"node-a", "node-b"}, assigned(t, jobs[0]))
	require.Equal(t, "during", jobs[1].GetSpec().GetName())

	nodes := c.listNodes()
	require.Len(t, nodes, 2)
	require.Equal(t, map[string]string{"pool": "train"}, nodes["node-a"].GetInfo().GetLabels())
	require.Len(t, nodes["node-b"].GetInfo().GetGpus(), 2)

	// The agents find the new controller by themselves.
	during := c.waitJobState("during", succeeded)
	require.Equal(t, uint64(1), during.GetGeneration())
	for _, n := range []string{"node-a", "node-b"} {
		c.waitNode(n, func(n *rdzvv1.Node) bool {
			return n.GetState() == rdzvv1.NodeState_NODE_STATE_READY && n.GetLastHeartbeat().AsTime().After(restarted)
		})
	}

	c.startJob(c.spec("after", 2, 2, "ok"))
	after := c.waitJobState("after", succeeded)
	require.Equal(t, []string{"node-a", "node-b"}, assigned(t, after))
	require.Len(t, c.listJobs(), 3)
}

func TestStreamLogs(t *testing.T) {
	c := newCluster(t)
	c.addAgent("node-a", 0, nil)
	c.addAgent("node-b", 0, nil)
	c.startJob(c.spec("train", 2, 2, "ok"))
	c.waitJobState("train", succeeded)

	read := func(req *rdzvv1.StreamLogsRequest) (string, string, error) {
		stream, err := c.jobs.StreamLogs(rpcCtx(t), req)
		require.NoError(t, err)
		var data strings.Builder
		node := ""
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return node, data.String(), nil
			}
			if err != nil {
				return node, data.String(), err
			}
			node = resp.GetNode()
			data.Write(resp.GetData())
		}
	}

	node, out, err := read(&rdzvv1.StreamLogsRequest{Job: "train"})
	require.NoError(t, err)
	require.Equal(t, "node-a", node, "logs default to the rank 0 node")
	require.Contains(t, out, "=== rdzv: job train generation 1 node node-a rank 0/2 started")
	require.Contains(t, out, "hello from node-a rank 0 generation 1\n")
	require.Contains(t, out, "=== rdzv: generation 1 ended: WORKER_STATE_SUCCEEDED exit_code=0")
	require.NotContains(t, out, "node-b")

	node, outB, err := read(&rdzvv1.StreamLogsRequest{Job: "train", Node: "node-b"})
	require.NoError(t, err)
	require.Equal(t, "node-b", node)
	require.Contains(t, outB, "hello from node-b rank 1 generation 1\n")

	_, tail, err := read(&rdzvv1.StreamLogsRequest{Job: "train", Node: "node-b", TailBytes: 20})
	require.NoError(t, err)
	require.Len(t, tail, 20)
	require.True(t, strings.HasSuffix(outB, tail))

	tests := []struct {
		name string
		req  *rdzvv1.StreamLogsRequest
		want codes.Code
	}{
		{"unknown node", &rdzvv1.StreamLogsRequest{Job: "train", Node: "ghost"}, codes.NotFound},
		{"unknown job", &rdzvv1.StreamLogsRequest{Job: "ghost"}, codes.NotFound},
		{"invalid node", &rdzvv1.StreamLogsRequest{Job: "train", Node: "No/De"}, codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := read(tt.req)
			require.Equal(t, tt.want, status.Code(err), "%v", err)
		})
	}

	t.Run("every node, tail in lines", func(t *testing.T) {
		stream, err := c.jobs.StreamLogs(rpcCtx(t), &rdzvv1.StreamLogsRequest{Job: "train", AllNodes: true, TailLines: 1})
		require.NoError(t, err)
		byNode := map[string]string{}
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			require.Equal(t, map[string]uint32{"node-a": 0, "node-b": 1}[resp.GetNode()], resp.GetNodeRank())
			byNode[resp.GetNode()] += string(resp.GetData())
		}
		require.Len(t, byNode, 2)
		for node, out := range byNode {
			require.Equal(t, "=== rdzv: generation 1 ended: WORKER_STATE_SUCCEEDED exit_code=0 signal=\"\" \n", out, "the last line of %s", node)
		}
		_, _, err = read(&rdzvv1.StreamLogsRequest{Job: "train", AllNodes: true, Node: "node-a"})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "all_nodes with a node: %v", err)
	})

	t.Run("follow until the workers exit", func(t *testing.T) {
		c.startJob(c.spec("follow", 2, 2, "gate"))
		c.waitRunning("follow")
		stream, err := c.jobs.StreamLogs(rpcCtx(t), &rdzvv1.StreamLogsRequest{Job: "follow", Follow: true})
		require.NoError(t, err)
		var out strings.Builder
		for !strings.Contains(out.String(), "hello from node-a") {
			resp, err := stream.Recv()
			require.NoError(t, err, "stream ended while the job ran; got %q", out.String())
			out.Write(resp.GetData())
		}
		c.release("follow")
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			out.Write(resp.GetData())
		}
		require.True(t, strings.HasSuffix(out.String(), "=== rdzv: generation 1 ended: WORKER_STATE_SUCCEEDED exit_code=0 signal=\"\" \n"),
			"a followed log ends with the closing line: %q", out.String())
	})

	t.Run("job that never ran", func(t *testing.T) {
		c.startJob(c.spec("waiting", 5, 5, "ok"))
		_, _, err := read(&rdzvv1.StreamLogsRequest{Job: "waiting"})
		require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	})

	t.Run("a reused job name shows its own run only", func(t *testing.T) {
		_, err := c.jobs.DeleteJob(rpcCtx(t), &rdzvv1.DeleteJobRequest{Name: "train"})
		require.NoError(t, err)
		c.startJob(c.spec("train", 2, 2, "ok"))
		c.waitJobState("train", succeeded)
		_, out, err := read(&rdzvv1.StreamLogsRequest{Job: "train", Node: "node-b"})
		require.NoError(t, err)
		require.Equal(t, 1, strings.Count(out, "=== rdzv: job train generation"), "one run's generation, not the deleted run's too: %q", out)
		require.Contains(t, out, "hello from node-b rank 1")
	})
}

// TestHeartbeatsDoNotWriteEtcd checks that liveness stays in memory: with
// 10,000 agents, a write per heartbeat would swamp etcd.
func TestHeartbeatsDoNotWriteEtcd(t *testing.T) {
	c := newFakeClockCluster(t)
	c.addAgent("node-a", 0, nil)
	c.addAgent("node-b", 0, nil)
	seen := c.listNodes()

	rev := c.etcdRevision()
	// Twenty heartbeat intervals, in each a heartbeat from both agents and
	// a liveness pass.
	for range 20 {
		c.advance(heartbeatInterval, "node-a", "node-b")
	}
	require.Equal(t, rev, c.etcdRevision(), "etcd was written while agents only sent heartbeats")

	for name, n := range c.listNodes() {
		require.True(t, n.GetLastHeartbeat().AsTime().After(seen[name].GetLastHeartbeat().AsTime()),
			"no heartbeat from %s during the check", name)
		require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, n.GetState())
	}
}

// TestSilentNodeIsLost: a node that stops heartbeating but keeps its
// stream open, as behind a network partition, is declared lost and fails
// its job.
func TestSilentNodeIsLost(t *testing.T) {
	c := newCluster(t)
	c.addAgent("node-a", 0, nil)
	silent := c.connectFake("node-b")
	c.startJob(c.spec("train", 2, 2, "hang"))
	silent.run()
	c.waitRunning("train")
	recA := c.record("train", "node-a", 1)

	lost := c.waitNode("node-b", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST })
	require.Empty(t, lost.GetJob())
	j := c.waitJobState("train", failed)
	require.Contains(t, j.GetReason(), "node node-b (rank 1)")
	require.Contains(t, j.GetReason(), "node lost: no heartbeat for")
	b := assignment(t, j, "node-b")
	require.Equal(t, rdzvv1.WorkerState_WORKER_STATE_FAILED, b.GetState())

	// Events are read from etcd, and the job's state from memory, where
	// decisions show a moment before they are durable.
	c.waitEvent("train", "node_lost")
	var lostEvents []*rdzvv1.Event
	for _, ev := range c.events("train") {
		if ev.GetKind() == "node_lost" {
			lostEvents = append(lostEvents, ev)
		}
	}
	require.Len(t, lostEvents, 1, "the loss is one of the job's events")
	require.Equal(t, "node-b", lostEvents[0].GetNode())
	require.Equal(t, uint64(1), lostEvents[0].GetGeneration())

	c.waitGroupGone(recA.PID)
	c.waitIdle("node-a")
}

// TestControllerEndsAgentStreams: when the controller drops an agent's
// session (the node was declared lost, or the controller shuts down) it
// must end the stream too. An agent only reconnects and re-registers when
// its stream ends; one whose stream stays open keeps heartbeating into a
// session the controller has forgotten, and a lost node never comes back.
func TestControllerEndsAgentStreams(t *testing.T) {
	tests := []struct {
		name string
		drop func(*cluster)
	}{
		{"node declared lost", func(c *cluster) {
			c.waitNode("node-b", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST })
		}},
		{"controller shutting down", func(c *cluster) { c.stopController() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t)
			f := c.connectFake("node-b")
			tt.drop(c)
			// The agent is still there and heartbeats as if nothing happened.
			for seq := uint64(1); !f.closed(); seq++ {
				require.Less(t, seq, uint64(waitTimeout/heartbeatInterval), "the controller never ended the stream")
				if f.stream.Send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: seq}}}) != nil {
					break
				}
				time.Sleep(heartbeatInterval)
			}
			err := f.waitEnd()
			require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), "agent stream ended by the controller")
		})
	}
}

// TestAgentRestartDuringJob: an agent process dies without a word and is
// back before the heartbeat timeout, without the workers the controller
// expects of it.
func TestAgentRestartDuringJob(t *testing.T) {
	tests := []struct {
		name string
		// stopFirst stops the job while the agent is away.
		stopFirst  bool
		want       rdzvv1.JobState
		wantReason string
	}{
		{name: "running job fails", want: failed, wantReason: "node node-b (rank 1): workers exited with code -1 (agent reconnected without its workers)"},
		{name: "stopping job stops", stopFirst: true, want: stopped, wantReason: "stopped by operator"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A long heartbeat timeout: the restart, not the timeout, must
			// settle the job.
			c := newCluster(t, func(cfg *controller.Config) { cfg.Heartbeat.Timeout.Duration = time.Minute })
			c.addAgent("node-a", 0, nil)
			crashed := c.connectFake("node-b")
			c.startJob(c.spec("train", 2, 2, "hang"))
			crashed.run()
			c.waitRunning("train")

			crashed.crash()
			if tt.stopFirst {
				require.Equal(t, stopping, c.stopJob("train").GetState())
				c.waitJob("train", func(j *rdzvv1.Job) bool {
					return assignment(t, j, "node-a").GetState() == rdzvv1.WorkerState_WORKER_STATE_STOPPED
				})
			}
			c.addAgent("node-b", 0, nil)

			j := c.waitJob("train", func(j *rdzvv1.Job) bool { return j.GetState() != running && j.GetState() != stopping })
			require.Equal(t, tt.want, j.GetState(), j.GetReason())
			require.Contains(t, j.GetReason(), tt.wantReason)
			c.waitIdle("node-a", "node-b")
		})
	}
}

// TestRestartingAgentKeepsItsNode: an agent that exits saying it restarts,
// its workers left running under their shims, is not declared lost for the
// hold it asked for, however silent. Back in time with its workers, the job
// goes on in the same generation; not back, the node is lost once the hold
// is over (by then the shims have killed the workers).
func TestRestartingAgentKeepsItsNode(t *testing.T) {
	const hold = 4 * heartbeatTimeout
	tests := []struct {
		name      string
		comesBack bool
	}{
		{"back in time", true},
		{"never back", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newFakeClockCluster(t)
			c.addAgent("node-a", 0, nil)
			b := c.connectFake("node-b")
			b.keepAlive()
			c.startJob(c.spec("train", 2, 2, "hang"))
			a := b.run()
			c.waitRunning("train")

			// The clock stands still until advanced: the hold starts now.
			b.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Restarting{Restarting: &rdzvv1.AgentRestarting{HoldMs: uint32(hold.Milliseconds())}}})
			c.waitEvent("train", controller.EventAgentRestarting)
			b.crash()
			c.advance(2*heartbeatTimeout, "node-a")
			require.Equal(t, rdzvv1.NodeState_NODE_STATE_BUSY, c.listNodes()["node-b"].GetState(), "held past the heartbeat timeout")
			require.Equal(t, running, c.getJob("train").GetState())

			if !tt.comesBack {
				c.advance(hold-2*heartbeatTimeout-time.Millisecond, "node-a")
				require.Equal(t, rdzvv1.NodeState_NODE_STATE_BUSY, c.listNodes()["node-b"].GetState(), "held until the hold is over")
				c.advance(time.Millisecond, "node-a")
				require.Equal(t, rdzvv1.NodeState_NODE_STATE_LOST, c.listNodes()["node-b"].GetState(), "lost once the hold is over")
				c.waitJobState("train", failed)
				return
			}
			back := c.connectFake("node-b", &rdzvv1.WorkerStatus{Job: "train", Generation: a.GetGeneration(), State: rdzvv1.WorkerState_WORKER_STATE_RUNNING})
			back.keepAlive()
			// Past the hold, the node is judged by its heartbeats again.
			c.advance(hold, "node-a", "node-b")
			j := c.getJob("train")
			require.Equal(t, running, j.GetState(), j.GetReason())
			require.Equal(t, a.GetGeneration(), j.GetGeneration(), "no restart")
			require.Zero(t, j.GetRestarts())
			require.Equal(t, rdzvv1.NodeState_NODE_STATE_BUSY, c.listNodes()["node-b"].GetState())
			require.Equal(t, rdzvv1.WorkerState_WORKER_STATE_RUNNING, assignment(t, j, "node-b").GetState())
		})
	}
}

// TestRestartHoldOutlivesTheController: the controller itself restarts (as
// in a failover) while an agent restarts, and the agent's peers, whose
// gossip with it is down too, report it unreachable. The next controller
// still holds the node, so the job is not restarted, and the agent back
// with its workers carries on in the same generation.
func TestRestartHoldOutlivesTheController(t *testing.T) {
	c := newFakeClockCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	c.startJob(c.spec("train", 2, 2, "hang"))
	aRun, bRun := a.run(), b.run()
	c.waitRunning("train")

	// Longer than the test advances the clock: nothing waits it out.
	const hold = 30 * heartbeatTimeout
	b.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Restarting{Restarting: &rdzvv1.AgentRestarting{HoldMs: uint32(hold.Milliseconds())}}})
	c.waitEvent("train", controller.EventAgentRestarting)
	require.NotNil(t, c.listNodes()["node-b"].GetRestartHoldUntil(), "the hold is stored")
	b.crash()

	c.stopController()
	a.crash()
	c.startController()
	runningWorker := func(job string, gen uint64) *rdzvv1.WorkerStatus {
		return &rdzvv1.WorkerStatus{Job: job, Generation: gen, State: rdzvv1.WorkerState_WORKER_STATE_RUNNING}
	}
	a = c.connectFake("node-a", runningWorker("train", aRun.GetGeneration()))
	a.keepAlive()
	// Without the stored hold, one peer's word is enough to cut the new
	// controller's start-up grace short.
	a.view(2, "node-b")
	// advance waits for node-a to be heard after its view, so its passes
	// count the vote.
	c.advance(2*heartbeatTimeout, "node-a")
	j := c.getJob("train")
	require.Equal(t, running, j.GetState(), j.GetReason())
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_BUSY, c.listNodes()["node-b"].GetState())

	b = c.connectFake("node-b", runningWorker("train", bRun.GetGeneration()))
	b.keepAlive()
	require.Nil(t, c.listNodes()["node-b"].GetRestartHoldUntil(), "cleared when the agent is back")
	a.view(2)
	j = c.getJob("train")
	require.Equal(t, running, j.GetState(), j.GetReason())
	require.Equal(t, bRun.GetGeneration(), j.GetGeneration(), "no restart")
	require.Zero(t, j.GetRestarts())
	require.NotContains(t, eventKinds(c.events("train")), "node_lost")
}
