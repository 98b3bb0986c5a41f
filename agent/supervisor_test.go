package agent

import (
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rdzv/rdzv/agent/launchertest"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

const (
	wRunning   = rdzvv1.WorkerState_WORKER_STATE_RUNNING
	wSucceeded = rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED
	wFailed    = rdzvv1.WorkerState_WORKER_STATE_FAILED
	wStopped   = rdzvv1.WorkerState_WORKER_STATE_STOPPED
)

func TestSupervisorRunsToExit(t *testing.T) {
	tests := []struct {
		name      string
		command   []string
		wantState rdzvv1.WorkerState
		wantCode  int32
	}{
		{"success", []string{"ok"}, wSucceeded, 0},
		{"failure", []string{"exit", "3"}, wFailed, 3},
		{"launcher usage error", []string{"bogus"}, wFailed, 99},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newSupervisor(t)
			before := time.Now()
			h.sup.Assign(h.assignment("train", 1, tt.command...))
			h.expect("train", 1, wRunning)
			st := h.expect("train", 1, tt.wantState)
			require.NotNil(t, st.GetExitedAt(), "the exit time is reported for detection latency")
			require.WithinRange(t, st.GetExitedAt().AsTime(), before, time.Now())
			require.Equal(t, tt.wantCode, st.GetExitCode())
			require.Empty(t, st.GetSignal())
			require.Empty(t, st.GetMessage())
			require.False(t, h.sup.Running("train"))
			require.Empty(t, groupMembers(h.record("train", 1).PID))
		})
	}
}

func TestSupervisorLaunchesWithRendezvous(t *testing.T) {
	// Of the agent's own environment, workers get the locale and time zone
	// only.
	t.Setenv("AGENT_VAR", "from-agent")
	t.Setenv("JOB_VAR", "from-agent")
	t.Setenv("NCCL_SOCKET_IFNAME", "from-agent")
	t.Setenv("RDZV_NODE", "from-agent")
	t.Setenv("HOME", "/from-agent")
	t.Setenv("PATH", "/from-agent:"+os.Getenv("PATH"))
	t.Setenv("LANG", "C.UTF-8")
	t.Setenv("TZ", "Europe/Paris")
	t.Setenv("LC_ALL", "")
	require.NoError(t, os.Unsetenv("LC_ALL")) // t.Setenv restores it

	self, err := user.LookupId(strconv.Itoa(os.Geteuid()))
	require.NoError(t, err)
	h := newSupervisor(t)
	a := h.assignment("train", 7, "ok")
	ckpt := filepath.Join(t.TempDir(), "train") // its parent is enough
	a.Spec.CheckpointDir = ckpt
	a.ResumeFrom = ckpt + "/step-100"
	h.sup.Assign(a)
	h.expect("train", 7, wRunning)
	h.expect("train", 7, wSucceeded)

	rec := h.record("train", 7)
	require.Equal(t, []string{
		"--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "2",
		"--master_addr", "10.0.0.1", "--master_port", "29500", "train.py", "ok",
	}, rec.Args)
	require.Equal(t, map[string]string{
		"NCCL_SOCKET_IFNAME":         "eth9",
		"GLOO_SOCKET_IFNAME":         "eth9",
		"CUDA_VISIBLE_DEVICES":       "2,3",
		"RDZV_JOB":                   "train",
		"RDZV_GENERATION":            "7",
		"RDZV_NODE":                  "node-a",
		"RDZV_NODE_RANK":             "1",
		"RDZV_CHECKPOINT_DIR":        ckpt,
		"RDZV_RESUME_FROM":           ckpt + "/step-100",
		"RDZV_MEMCKPT_DIR":           "",
		"RDZV_RESUME_MEMORY":         "",
		"RDZV_RESUME_MEMORY_WORLD":   "",
		"RDZV_MEMCKPT_PERSIST_EVERY": "",
		"RDZV_AGENT_ADDR":            "127.0.0.1:7071",
		"MASTER_ADDR":                "10.0.0.1",
		"MASTER_PORT":                "29500",
		"WORLD_SIZE":                 "4",
		"NODE_RANK":                  "1",
		"RDZV_NNODES":                "2",
		"RDZV_PROCS_PER_NODE":        "2",
		"RDZV_REPORT_TOKEN":          rec.Env["RDZV_REPORT_TOKEN"], // random, checked below
		"JOB_VAR":                    "from-job",
		"PATH":                       DefaultWorkerPath,
		"LANG":                       "C.UTF-8",
		"TZ":                         "Europe/Paris",
		// The run_as user's (this test's own), not the agent's.
		"HOME":    self.HomeDir,
		"USER":    self.Username,
		"LOGNAME": self.Username,
		// The shell's own.
		"PWD": h.workdir,
	}, rec.Env)
	require.Regexp(t, "^[0-9a-f]{64}$", rec.Env["RDZV_REPORT_TOKEN"])
}

func TestSupervisorScratchWorkdir(t *testing.T) {
	h := newSupervisor(t)
	a := h.assignment("scratch", 1, "ok")
	a.Spec.Workdir = ""
	h.sup.Assign(a)
	h.expect("scratch", 1, wRunning)
	h.expect("scratch", 1, wSucceeded)
	// fakeTorchrun records into its working directory.
	require.FileExists(t, filepath.Join(h.stateDir, "jobs", "scratch", "scratch-1"),
		"workers without a workdir run in the agent's scratch directory")
}

func TestSupervisorRejectsStaleAssignments(t *testing.T) {
	h := newSupervisor(t)
	h.sup.Assign(h.assignment("train", 2, "ok"))
	h.expect("train", 2, wRunning)
	h.expect("train", 2, wSucceeded)
	first := h.record("train", 2)

	h.sup.Assign(h.assignment("train", 2, "ok"))
	h.sup.Assign(h.assignment("train", 1, "ok"))
	// Commands apply in order, so the marker's update coming next means
	// neither stale assignment produced one.
	h.sync()
	require.NoFileExists(t, h.recordPath("train", 1))
	require.Equal(t, first.PID, h.record("train", 2).PID, "generation 2 ran twice")

	// Generations are per job: another job's generation 1 is fine.
	h.sup.Assign(h.assignment("other", 1, "ok"))
	h.expect("other", 1, wRunning)
	h.expect("other", 1, wSucceeded)
}

func TestSupervisorStopsCurrentGeneration(t *testing.T) {
	h := newSupervisor(t)
	h.sup.Assign(h.assignment("train", 1, "hang"))
	h.expect("train", 1, wRunning)
	require.True(t, h.sup.Running("train"))
	pgid := h.record("train", 1).PID
	require.NotEmpty(t, groupMembers(pgid))

	h.sup.Stop("train", 1, "stopped by operator")
	st := h.expect("train", 1, wStopped)
	require.Equal(t, "stopped by operator", st.GetMessage())
	require.NotNil(t, st.GetExitedAt())
	require.Equal(t, "SIGTERM", st.GetSignal())
	require.EqualValues(t, -1, st.GetExitCode())
	// The update is sent only after the whole group is gone.
	require.Empty(t, groupMembers(pgid))
	require.False(t, h.sup.Running("train"))
	requireProto(t, []*rdzvv1.WorkerStatus{st}, h.sup.Statuses())

	// A repeated stop re-reports the outcome instead of inventing one.
	h.sup.Stop("train", 1, "again")
	requireProto(t, st, h.expect("train", 1, wStopped))
}

// A stop with a grace shorter than stop_grace is done within it: a worker
// that ignores SIGTERM is killed then, not after the agent's stop_grace
// (an hour here, so a stop that waited it out would never be reported).
func TestSupervisorStopOrderedWithin(t *testing.T) {
	needPython(t)
	h := newSupervisor(t, func(cfg *Config) { cfg.StopGrace.Duration = time.Hour })
	ready := filepath.Join(h.workdir, "ignoring")
	h.sup.Assign(h.assignment("train", 1, "py", "-c",
		"import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); pathlib.Path(sys.argv[1]).touch(); time.sleep(300)", ready))
	h.expect("train", 1, wRunning)
	// Stopped only once it ignores SIGTERM, so the kill is what ends it.
	require.Eventually(t, func() bool { _, err := os.Stat(ready); return err == nil }, 30*time.Second, 20*time.Millisecond)

	h.sup.Ordered(&rdzvv1.StopWorkers{Job: "train", Generation: 1, Reason: "generation 1 failed", Grace: durationpb.New(100 * time.Millisecond)})
	st := h.expect("train", 1, wStopped)
	require.Equal(t, "SIGKILL", st.GetSignal(), "SIGTERM was ignored; the short grace ended in SIGKILL")
	require.Equal(t, "generation 1 failed", st.GetMessage())
}

// Workers whose exit is being handled count as running until the exit is
// recorded: a registration in between (Statuses) that left them out made
// the controller take the node for one whose agent lost its workers, and
// fail a job whose workers had just succeeded (seen in a failover test).
func TestStatusesWhileWorkersExit(t *testing.T) {
	h := newSupervisor(t)
	// A standby still starting holds the exit's handling open: a job's
	// success waits for its standby, to kill it before the exit is told.
	ready := make(chan struct{})
	// Written before the Assign that has the run goroutine read it.
	h.sup.standby = &standby{job: "train", ready: ready}

	h.sup.Assign(h.assignment("train", 1, "ok"))
	h.expect("train", 1, wRunning)
	require.Eventually(t, func() bool { return !h.sup.Busy() }, waitTimeout, 10*time.Millisecond, "the workers exit")
	status := func() rdzvv1.WorkerState {
		for _, st := range h.sup.Statuses() {
			if st.GetJob() == "train" && st.GetGeneration() == 1 {
				return st.GetState()
			}
		}
		return rdzvv1.WorkerState_WORKER_STATE_UNSPECIFIED
	}
	require.Equal(t, wRunning, status(), "exiting, not yet recorded: still running for a registration")

	close(ready)
	h.expect("train", 1, wSucceeded)
	require.Equal(t, wSucceeded, status())
}

func TestSupervisorStopOfUnknownGeneration(t *testing.T) {
	h := newSupervisor(t)
	h.sup.Stop("train", 3, "freeing the node")
	st := h.expect("train", 3, wStopped)
	require.Equal(t, "not running on this node: freeing the node", st.GetMessage())
	require.Nil(t, st.GetExitedAt(), "nothing exited")

	// The stop fenced generation 3: its assignment arriving late is dropped.
	h.sup.Assign(h.assignment("train", 3, "ok"))
	h.sync()
	require.NoFileExists(t, h.recordPath("train", 3))

	h.sup.Assign(h.assignment("train", 4, "ok"))
	h.expect("train", 4, wRunning)
	h.expect("train", 4, wSucceeded)

	// Stopping another job's generation leaves the running one alone.
	h.sup.Assign(h.assignment("train", 5, "hang"))
	h.expect("train", 5, wRunning)
	h.sup.Stop("other", 5, "not ours")
	h.expect("other", 5, wStopped)
	require.True(t, h.sup.Running("train"))
	h.sup.Stop("train", 4, "old generation")
	h.expect("train", 4, wSucceeded) // its recorded outcome, re-reported
	require.True(t, h.sup.Running("train"))
}

func TestSupervisorReplacesRunningWorkers(t *testing.T) {
	tests := []struct {
		name    string
		nextJob string
		nextGen uint64
		reason  string
	}{
		{"next generation of the same job", "train", 2, "replaced by generation 2 of job train"},
		{"another job", "eval", 1, "replaced by generation 1 of job eval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newSupervisor(t)
			h.sup.Assign(h.assignment("train", 1, "hang"))
			h.expect("train", 1, wRunning)
			old := h.record("train", 1).PID

			h.sup.Assign(h.assignment(tt.nextJob, tt.nextGen, "ok"))
			// The old workers are gone before the new ones start.
			st := h.expect("train", 1, wStopped)
			require.Equal(t, tt.reason, st.GetMessage())
			require.Empty(t, groupMembers(old))
			h.expect(tt.nextJob, tt.nextGen, wRunning)
			h.expect(tt.nextJob, tt.nextGen, wSucceeded)
		})
	}
}

func TestSupervisorStatuses(t *testing.T) {
	h := newSupervisor(t)
	require.Empty(t, h.sup.Statuses())

	h.sup.Assign(h.assignment("train", 1, "exit", "2"))
	h.expect("train", 1, wRunning)
	done := h.expect("train", 1, wFailed)
	h.sup.Assign(h.assignment("train", 2, "hang"))
	h.expect("train", 2, wRunning)
	requireProto(t, []*rdzvv1.WorkerStatus{
		done,
		{Job: "train", Generation: 2, State: wRunning},
	}, h.sup.Statuses(), "finished history, then what runs now")

	// History is bounded: only the newest outcomes are kept.
	for gen := uint64(1); gen <= HistorySize+4; gen++ {
		h.sup.Stop("noise", gen, "noise")
		h.expect("noise", gen, wStopped)
	}
	got := h.sup.Statuses()
	require.Len(t, got, HistorySize+1)
	require.Equal(t, uint64(5), got[0].GetGeneration())
	require.Equal(t, uint64(HistorySize+4), got[HistorySize-1].GetGeneration())
	require.Equal(t, "train", got[HistorySize].GetJob())
}

func TestSupervisorLogFile(t *testing.T) {
	h := newSupervisor(t)
	h.sup.Assign(h.assignment("train", 1, "ok"))
	h.expect("train", 1, wRunning)
	h.expect("train", 1, wSucceeded)
	h.sup.Assign(h.assignment("train", 2, "exit", "3"))
	h.expect("train", 2, wRunning)
	h.expect("train", 2, wFailed)

	path, err := h.sup.LogPath("train")
	require.NoError(t, err)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	require.Len(t, lines, 6, "generations append to one log:\n%s", b)
	require.True(t, strings.HasPrefix(lines[0], "=== rdzv: job train generation 1 node node-a rank 1/2 started "), lines[0])
	require.True(t, strings.HasSuffix(lines[0], h.torchrun+" --nnodes 2 --node_rank 1 --nproc_per_node 2 --master_addr 10.0.0.1 --master_port 29500 train.py ok"), lines[0])
	require.Equal(t, "hello from node-a generation 1", lines[1])
	require.Equal(t, `=== rdzv: generation 1 ended: WORKER_STATE_SUCCEEDED exit_code=0 signal="" `, lines[2])
	require.True(t, strings.HasPrefix(lines[3], "=== rdzv: job train generation 2 node node-a rank 1/2 started "), lines[3])
	require.Equal(t, "hello from node-a generation 2", lines[4])
	require.Equal(t, `=== rdzv: generation 2 ended: WORKER_STATE_FAILED exit_code=3 signal="" `, lines[5])
}

func TestSupervisorRefusesToStart(t *testing.T) {
	shadow, err := user.LookupGroup("shadow")
	require.NoError(t, err, "Debian has a group shadow")
	tests := []struct {
		name        string
		edit        func(*rdzvv1.Assignment)
		wantMessage []string
		// wantFailure is the configuration failure's class, if it is one.
		wantFailure string
	}{
		{"spec fails validation", func(a *rdzvv1.Assignment) { a.Spec.Command = nil },
			[]string{"refusing assignment", "command: is required"}, ""},
		{"reserved env", func(a *rdzvv1.Assignment) { a.Spec.Env = map[string]string{"CUDA_VISIBLE_DEVICES": "0"} },
			[]string{"refusing assignment", "env.CUDA_VISIBLE_DEVICES"}, ""},
		{"launcher not found", func(a *rdzvv1.Assignment) { a.Spec.LauncherTorchrun = "/nonexistent/torchrun" },
			[]string{`launcher_missing: launcher "/nonexistent/torchrun" not found on node node-a`}, wire.FailureLauncherMissing},
		{"launcher not on PATH", func(a *rdzvv1.Assignment) { a.Spec.LauncherTorchrun = "rdzv-no-such-torchrun" },
			[]string{`launcher "rdzv-no-such-torchrun" not found on node node-a: not in the workers' PATH ` + DefaultWorkerPath}, wire.FailureLauncherMissing},
		{"python-module's python not on PATH", func(a *rdzvv1.Assignment) {
			a.Spec.LauncherTorchrun, a.Spec.LauncherKind, a.Spec.LauncherPython = "", "python-module", "rdzv-no-such-python"
		}, []string{`launcher "rdzv-no-such-python" not found on node node-a`}, wire.FailureLauncherMissing},
		{"workdir missing", func(a *rdzvv1.Assignment) { a.Spec.Workdir = "/nonexistent/rdzv-job" },
			[]string{"workdir_missing: workdir /nonexistent/rdzv-job is not a directory on node node-a"}, wire.FailureWorkdirMissing},
		{"workdir a file", func(a *rdzvv1.Assignment) { a.Spec.Workdir = "/etc/hostname" },
			[]string{"workdir /etc/hostname is not a directory on node node-a"}, wire.FailureWorkdirMissing},
		{"checkpoint dir and its parent missing", func(a *rdzvv1.Assignment) { a.Spec.CheckpointDir = "/nonexistent/shared/ckpt" },
			[]string{"checkpoint_dir_missing: checkpoint.dir /nonexistent/shared/ckpt is not a directory on node node-a, nor is its parent /nonexistent/shared"}, wire.FailureCheckpointDirMissing},
		{"run_as with a privileged group", func(a *rdzvv1.Assignment) { a.Spec.RunAs = "65534:" + shadow.Gid },
			[]string{`run_as "65534:` + shadow.Gid + `": has primary group ` + shadow.Gid + ` (shadow), which matches "shadow" in this agent's run_as_policy.privileged_groups; to allow it, remove "shadow" from that list`}, ""},
		{"run_as a system user", func(a *rdzvv1.Assignment) { a.Spec.RunAs = "daemon" },
			[]string{`run_as "daemon": is uid 1 (daemon), which matches no entry of this agent's run_as_policy.allowed_users`}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newSupervisor(t)
			a := h.assignment("train", 1, "ok")
			tt.edit(a)
			h.sup.Assign(a)
			st := h.expect("train", 1, wFailed)
			require.EqualValues(t, -1, st.GetExitCode())
			require.Nil(t, st.GetExitedAt(), "nothing ran")
			require.Equal(t, tt.wantFailure, st.GetFailure())
			for _, m := range tt.wantMessage {
				require.Contains(t, st.GetMessage(), m)
			}
			require.False(t, h.sup.Running("train"))
			require.NoFileExists(t, h.recordPath("train", 1))
			requireProto(t, []*rdzvv1.WorkerStatus{st}, h.sup.Statuses())
		})
	}
}

// TestSupervisorWorkersPath finds the launcher where the workers would, on
// their PATH: the agent's own PATH is not theirs.
func TestSupervisorWorkersPath(t *testing.T) {
	h := newSupervisor(t)
	// A name no system directory has (there may be a real torchrun).
	dir, name := t.TempDir(), "rdzv-test-launcher"
	require.NoError(t, os.Symlink(h.torchrun, filepath.Join(dir, name)))
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	a := h.assignment("train", 1, "ok")
	a.Spec.LauncherTorchrun = name
	h.sup.Assign(a)
	st := h.expect("train", 1, wFailed)
	require.Contains(t, st.GetMessage(), `launcher "rdzv-test-launcher" not found on node node-a: not in the workers' PATH`)

	a = h.assignment("train", 2, "ok")
	a.Spec.LauncherTorchrun = name
	// A relative entry is skipped: it would be the agent's directory.
	jobPath := "relative:" + dir + ":/usr/bin:/bin"
	a.Spec.Env["PATH"] = jobPath
	h.sup.Assign(a)
	h.expect("train", 2, wRunning)
	h.expect("train", 2, wSucceeded)
	require.Equal(t, jobPath, h.record("train", 2).Env["PATH"], "the job's PATH is the workers'")
}

// TestSupervisorJobLogMode keeps job logs from other local users, including
// a log an older agent left readable by all.
func TestSupervisorJobLogMode(t *testing.T) {
	h := newSupervisor(t)
	logPath, err := h.sup.LogPath("train")
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Dir(logPath), 0o755))
	require.NoError(t, os.WriteFile(logPath, []byte("old\n"), 0o644))
	h.sup.Assign(h.assignment("train", 1, "ok"))
	h.expect("train", 1, wRunning)
	h.expect("train", 1, wSucceeded)
	info, err := os.Stat(logPath)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o640), info.Mode().Perm())

	other, err := h.sup.LogPath("other")
	require.NoError(t, err)
	h.sup.Assign(h.assignment("other", 1, "ok"))
	h.expect("other", 1, wRunning)
	h.expect("other", 1, wSucceeded)
	info, err = os.Stat(other)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o640), info.Mode().Perm())
}

// The agent hands every launcher kind the assignment as the controller
// decided it; jobspec spells it per kind.
func TestLaunchFromAssignment(t *testing.T) {
	tests := []struct {
		name    string
		a       *rdzvv1.Assignment
		program string
		want    []string
	}{
		{
			name: "torchrun: rendezvous then command",
			a: &rdzvv1.Assignment{
				Spec:   &rdzvv1.JobSpec{LauncherKind: "torchrun", Command: []string{"train.py", "--lr", "3e-4"}},
				Nnodes: 16, NodeRank: 15, ProcsPerNode: 8, MasterAddr: "10.1.2.3", MasterPort: 29517,
			},
			program: "torchrun",
			want: []string{"--nnodes", "16", "--node_rank", "15", "--nproc_per_node", "8",
				"--master_addr", "10.1.2.3", "--master_port", "29517", "train.py", "--lr", "3e-4"},
		},
		{
			name: "extra launcher args go before the command",
			a: &rdzvv1.Assignment{
				Spec:   &rdzvv1.JobSpec{LauncherKind: "torchrun", Command: []string{"-m", "pkg.train"}, LauncherExtraArgs: []string{"--redirects", "3", "--max_restarts=0"}},
				Nnodes: 1, ProcsPerNode: 1, MasterAddr: "127.0.0.1", MasterPort: 29500,
			},
			program: "torchrun",
			want: []string{"--nnodes", "1", "--node_rank", "0", "--nproc_per_node", "1",
				"--master_addr", "127.0.0.1", "--master_port", "29500", "--redirects", "3", "--max_restarts=0", "-m", "pkg.train"},
		},
		{
			name: "custom template",
			a: &rdzvv1.Assignment{
				Spec:       &rdzvv1.JobSpec{Name: "j", Command: []string{"x.py"}, LauncherKind: "custom", LauncherArgv: []string{"run", "{nnodes}:{node_rank}:{nproc_per_node}", "{master_addr}:{master_port}", "{rdzv_id}"}},
				Generation: 7, Nnodes: 3, NodeRank: 2, ProcsPerNode: 4, MasterAddr: "10.0.0.1", MasterPort: 29500,
			},
			program: "run",
			want:    []string{"3:2:4", "10.0.0.1:29500", "j-7", "x.py"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			program, args := jobspec.FromProto(tt.a.GetSpec()).Launch(assignedFor(tt.a))
			require.Equal(t, tt.program, program)
			require.Equal(t, tt.want, args)
		})
	}
}

// TestSupervisorEnvHasLastWord feeds env a spec that skipped validation:
// whatever the job or the agent's environment says, rdzv's values come last
// and so are the ones the worker sees (os/exec keeps the last duplicate).
func TestSupervisorEnvHasLastWord(t *testing.T) {
	t.Setenv("GLOO_SOCKET_IFNAME", "agent-env")
	t.Setenv("RDZV_JOB", "agent-env")
	h := newSupervisor(t)
	a := h.assignment("train", 4)
	a.Spec.Env = map[string]string{
		"NCCL_SOCKET_IFNAME":   "job-env",
		"GLOO_SOCKET_IFNAME":   "job-env",
		"CUDA_VISIBLE_DEVICES": "job-env",
		"RDZV_GENERATION":      "job-env",
		"RDZV_NODE":            "job-env",
		"RDZV_AGENT_ADDR":      "job-env",
		"RDZV_REPORT_TOKEN":    "job-env",
		"JOB_VAR":              "from-job",
	}
	env := h.sup.env(a, a.Spec.Env, []byte{0xab}, nil)

	last := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		last[k] = v
	}
	for k, want := range map[string]string{
		"NCCL_SOCKET_IFNAME":   "eth9",
		"GLOO_SOCKET_IFNAME":   "eth9",
		"CUDA_VISIBLE_DEVICES": "2,3",
		"RDZV_GENERATION":      "4",
		"RDZV_NODE":            "node-a",
		"RDZV_JOB":             "train",
		"RDZV_AGENT_ADDR":      "127.0.0.1:7071",
		"RDZV_REPORT_TOKEN":    "ab",
		"JOB_VAR":              "from-job",
		"PATH":                 DefaultWorkerPath,
	} {
		require.Equal(t, want, last[k], k)
	}
	require.NotContains(t, env, "GLOO_SOCKET_IFNAME=agent-env", "the agent's own value is dropped, not shadowed")
}

func TestJobPathsStayInStateDir(t *testing.T) {
	h := newSupervisor(t)
	for _, job := range []string{"../escape", "a/b", "", ".", "..", "UPPER", strings.Repeat("a", 64)} {
		_, err := h.sup.LogPath(job)
		require.Error(t, err, "job %q", job)
		_, err = h.sup.jobPath(job, "jobs", job)
		require.Error(t, err, "job %q", job)
	}
	p, err := h.sup.LogPath("train")
	require.NoError(t, err)
	require.Equal(t, filepath.Join(h.sup.stateDir, "logs", "train.log"), p)
	// Even a valid name is refused where the joined path leaves the state
	// directory.
	_, err = h.sup.jobPath("train", "..", "elsewhere")
	require.ErrorContains(t, err, "outside the state directory")
}

// recordingLauncher records how it was started and exits 0: a stand-in for
// any launcher kind, whatever its arguments.
var recordingLauncher = "#!/bin/sh\nrec=\"$PWD/$RDZV_JOB-$RDZV_GENERATION\"\n" + launchertest.Preamble("[A-Za-z_][A-Za-z0-9_]*") + "exit 0\n"

// Every launcher kind is started with the assignment in its own spelling,
// and the launcher's environment carries the assignment too.
func TestSupervisorLaunchesEachKind(t *testing.T) {
	tests := []struct {
		name string
		// set makes launcher the job's launcher of one kind.
		set  func(s *rdzvv1.JobSpec, launcher string)
		want []string
	}{
		{"torchrun", func(s *rdzvv1.JobSpec, l string) { s.LauncherTorchrun = l },
			[]string{"--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "2", "--master_addr", "10.0.0.1", "--master_port", "29500", "train.py", "ok"}},
		{"python-module", func(s *rdzvv1.JobSpec, l string) {
			s.LauncherKind, s.LauncherTorchrun, s.LauncherPython, s.LauncherModule = "python-module", "", l, "torch.distributed.run"
		}, []string{"-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "2", "--master_addr", "10.0.0.1", "--master_port", "29500", "train.py", "ok"}},
		{"accelerate", func(s *rdzvv1.JobSpec, l string) {
			s.LauncherKind, s.LauncherTorchrun, s.LauncherExecutable, s.LauncherExtraArgs = "accelerate", "", l, []string{"--multi_gpu"}
		}, []string{"launch", "--num_machines", "2", "--machine_rank", "1", "--num_processes", "4", "--main_process_ip", "10.0.0.1", "--main_process_port", "29500", "--rdzv_backend", "static", "--multi_gpu", "train.py", "ok"}},
		{"deepspeed", func(s *rdzvv1.JobSpec, l string) {
			s.LauncherKind, s.LauncherTorchrun, s.LauncherExecutable = "deepspeed", "", l
		}, []string{"--no_ssh", "--hostfile", "HOSTFILE", "--num_nodes", "2", "--node_rank", "1", "--num_gpus", "2", "--master_addr", "10.0.0.1", "--master_port", "29500", "train.py", "ok"}},
		{"custom", func(s *rdzvv1.JobSpec, l string) {
			s.LauncherKind, s.LauncherTorchrun, s.LauncherArgv = "custom", "", []string{l, "--world={world_size}", "{master_addr}:{master_port}", "{node_rank}/{nnodes}x{nproc_per_node}", "{rdzv_id}"}
		}, []string{"--world=4", "10.0.0.1:29500", "1/2x2", "train-5", "train.py", "ok"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newSupervisor(t)
			launcher := filepath.Join(t.TempDir(), "launcher")
			require.NoError(t, os.WriteFile(launcher, []byte(recordingLauncher), 0o755))
			a := h.assignment("train", 5, "ok")
			tt.set(a.Spec, launcher)
			h.sup.Assign(a)
			h.expect("train", 5, wRunning)
			h.expect("train", 5, wSucceeded)
			rec := h.record("train", 5)
			want := slices.Clone(tt.want)
			if i := slices.Index(want, "HOSTFILE"); i >= 0 {
				want[i] = filepath.Join(h.stateDir, "launch", "train.hostfile")
				b, err := os.ReadFile(want[i])
				require.NoError(t, err)
				require.Equal(t, "rdzv-node-0 slots=2\nrdzv-node-1 slots=2\n", string(b))
			}
			require.Equal(t, want, rec.Args)
			for k, v := range map[string]string{"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "4", "NODE_RANK": "1",
				"RDZV_NNODES": "2", "RDZV_PROCS_PER_NODE": "2", "NCCL_SOCKET_IFNAME": "eth9", "CUDA_VISIBLE_DEVICES": "2,3"} {
				require.Equal(t, v, rec.Env[k], k)
			}
		})
	}
}
