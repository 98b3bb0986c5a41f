package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/agent/gpu"
	"github.com/rdzv/rdzv/agent/netif"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// reportAt is the time the endpoint's clock gives every report.
var reportAt = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// reportEndpoint serves the report endpoint for h's supervisor.
func reportEndpoint(t *testing.T, h *supHarness) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(newReportHandler(h.sup, zaptest.NewLogger(t), func() time.Time { return reportAt }))
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, srv *httptest.Server, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestReportEndpoint(t *testing.T) {
	h := newSupervisor(t)
	root := t.TempDir()
	dir := filepath.Join(root, "ckpt")
	makeTree(t, root, "ckpt/step-10/COMPLETE", "ckpt/step-11/model.pt", "ckpt-evil/step-10/COMPLETE")
	a := h.assignment("train", 2, "hang")
	a.Spec.CheckpointDir = dir
	h.sup.Assign(a)
	h.expect("train", 2, wRunning)
	srv := reportEndpoint(t, h)

	ckpt := func(gen int, step, path string) string {
		return fmt.Sprintf(`{"job":"train","generation":%d,"step":%s,"path":%q}`, gen, step, path)
	}
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		wantStatus int
		wantBody   string
	}{
		{"step", "POST", "/v1/step", `{"job":"train","generation":2,"step":40}`, http.StatusNoContent, ""},
		{"step zero", "POST", "/v1/step", `{"job":"train","generation":2,"step":0}`, http.StatusNoContent, ""},
		{"unknown fields are ignored", "POST", "/v1/step", `{"job":"train","generation":2,"step":41,"rank":3}`, http.StatusNoContent, ""},
		{"stale generation", "POST", "/v1/step", `{"job":"train","generation":1,"step":900}`, http.StatusConflict,
			"job train generation 1 is not running on this node, which runs job train generation 2"},
		{"future generation", "POST", "/v1/step", `{"job":"train","generation":3,"step":900}`, http.StatusConflict, "not running on this node"},
		{"job name with a path", "POST", "/v1/step", `{"job":"../train","generation":2,"step":1}`, http.StatusBadRequest, "job: must be a DNS-1123 label"},
		{"missing job", "POST", "/v1/checkpoint", `{"generation":2,"step":1,"path":"/x"}`, http.StatusBadRequest, "job: must be a DNS-1123 label"},
		{"missing generation", "POST", "/v1/step", `{"job":"train","step":900}`, http.StatusConflict, "not running on this node"},
		{"wrong job", "POST", "/v1/step", `{"job":"eval","generation":2,"step":900}`, http.StatusConflict, "job eval generation 2 is not running"},
		{"negative step", "POST", "/v1/step", `{"job":"train","generation":2,"step":-1}`, http.StatusBadRequest, "step must be at least 0, got -1"},
		{"missing step", "POST", "/v1/step", `{"job":"train","generation":2}`, http.StatusBadRequest, "step is required"},
		{"fractional step", "POST", "/v1/step", `{"job":"train","generation":2,"step":1.5}`, http.StatusBadRequest, "not valid JSON"},
		{"not JSON", "POST", "/v1/step", `step=3`, http.StatusBadRequest, "not valid JSON"},
		{"trailing data", "POST", "/v1/step", `{"job":"train","generation":2,"step":3}{}`, http.StatusBadRequest, "not valid JSON"},
		{"oversized body", "POST", "/v1/step", `{"job":"train","generation":2,"step":3,"pad":"` + strings.Repeat("x", maxReportBytes) + `"}`,
			http.StatusRequestEntityTooLarge, "exceeds 4096 bytes"},
		{"wrong method", "GET", "/v1/step", "", http.StatusMethodNotAllowed, ""},
		{"unknown endpoint", "POST", "/v1/steps", `{}`, http.StatusNotFound, ""},

		{"checkpoint", "POST", "/v1/checkpoint", ckpt(2, "10", dir+"/step-10"), http.StatusNoContent, ""},
		{"checkpoint without marker, vouched for by the script", "POST", "/v1/checkpoint", ckpt(2, "11", dir+"/step-11"), http.StatusNoContent, ""},
		{"checkpoint of a stale generation", "POST", "/v1/checkpoint", ckpt(1, "10", dir+"/step-10"), http.StatusConflict, "not running on this node"},
		{"relative path", "POST", "/v1/checkpoint", ckpt(2, "10", "ckpt/step-10"), http.StatusBadRequest, "path: must be an absolute path"},
		{"unclean path", "POST", "/v1/checkpoint", ckpt(2, "10", dir+"/step-10/"), http.StatusBadRequest, "path: must be a clean path"},
		{"traversal", "POST", "/v1/checkpoint", ckpt(2, "10", dir+"/../ckpt-evil/step-10"), http.StatusBadRequest, "path: must be a clean path"},
		{"sibling sharing a prefix", "POST", "/v1/checkpoint", ckpt(2, "10", root+"/ckpt-evil/step-10"), http.StatusBadRequest, "path: must be inside " + dir},
		{"the directory itself", "POST", "/v1/checkpoint", ckpt(2, "10", dir), http.StatusBadRequest, "path: must be inside " + dir},
		{"missing directory", "POST", "/v1/checkpoint", ckpt(2, "12", dir+"/step-12"), http.StatusBadRequest, "no such file or directory"},
		{"a file", "POST", "/v1/checkpoint", ckpt(2, "10", dir+"/step-10/COMPLETE"), http.StatusBadRequest, "is not a directory"},
		{"missing path", "POST", "/v1/checkpoint", `{"job":"train","generation":2,"step":10}`, http.StatusBadRequest, "path is required"},
		{"negative checkpoint step", "POST", "/v1/checkpoint", ckpt(2, "-10", dir+"/step-10"), http.StatusBadRequest, "step must be at least 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := post(t, srv, tt.method, tt.path, tt.body)
			require.Equal(t, tt.wantStatus, status, body)
			require.Contains(t, body, tt.wantBody)
		})
	}

	// Only the accepted reports had an effect.
	requireProto(t, &rdzvv1.Progress{Job: "train", Generation: 2, Step: 41, At: timestamppb.New(reportAt)}, h.sup.Progress())
	requireProto(t, []*rdzvv1.CheckpointReport{
		{Job: "train", Generation: 2, Step: 10, Path: dir + "/step-10", Source: "helper"},
		{Job: "train", Generation: 2, Step: 11, Path: dir + "/step-11", Source: "helper"},
	}, h.queuedCheckpoints())
}

func TestReportWithoutCheckpointDir(t *testing.T) {
	h := newSupervisor(t)
	h.sup.Assign(h.assignment("train", 1, "hang"))
	h.expect("train", 1, wRunning)
	srv := reportEndpoint(t, h)
	elsewhere := t.TempDir()
	status, body := post(t, srv, "POST", "/v1/checkpoint", fmt.Sprintf(`{"job":"train","generation":1,"step":5,"path":%q}`, elsewhere))
	require.Equal(t, http.StatusNoContent, status, "any existing directory will do: %s", body)
	requireProto(t, []*rdzvv1.CheckpointReport{{Job: "train", Generation: 1, Step: 5, Path: elsewhere, Source: "helper"}}, h.queuedCheckpoints())
}

func TestReportWithNoWorkers(t *testing.T) {
	h := newSupervisor(t)
	srv := reportEndpoint(t, h)
	status, body := post(t, srv, "POST", "/v1/step", `{"job":"train","generation":1,"step":1}`)
	require.Equal(t, http.StatusConflict, status)
	require.Contains(t, body, "job train generation 1 is not running on this node: no workers run here")
	require.Nil(t, h.sup.Progress())
}

func TestProgressFollowsCurrentWorker(t *testing.T) {
	h := newSupervisor(t)
	h.sup.Assign(h.assignment("train", 1, "hang"))
	h.expect("train", 1, wRunning)
	require.Nil(t, h.sup.Progress(), "no progress before the first report")

	t0 := time.Now()
	require.NoError(t, h.sup.reportStep("train", 1, 50, t0))
	require.NoError(t, h.sup.reportStep("train", 1, 49, t0.Add(time.Second)), "a slower rank's step is accepted")
	requireProto(t, &rdzvv1.Progress{Job: "train", Generation: 1, Step: 50, At: timestamppb.New(t0)}, h.sup.Progress(),
		"the highest step is kept, with the time it was reached")
	require.NoError(t, h.sup.reportCheckpoint("train", 1, 60, "/ckpt/step-60", t0.Add(2*time.Second)))
	requireProto(t, &rdzvv1.Progress{Job: "train", Generation: 1, Step: 60, At: timestamppb.New(t0.Add(2 * time.Second))}, h.sup.Progress(),
		"a saved checkpoint is progress too")

	h.sup.Assign(h.assignment("train", 2, "hang"))
	h.expect("train", 1, wStopped)
	h.expect("train", 2, wRunning)
	require.Nil(t, h.sup.Progress(), "a new generation starts without progress")
	require.ErrorIs(t, h.sup.reportStep("train", 1, 70, t0), errNotRunning)
	require.NoError(t, h.sup.reportStep("train", 2, 3, t0))
	require.EqualValues(t, 3, h.sup.Progress().GetStep())

	h.sup.Stop("train", 2, "done")
	h.expect("train", 2, wStopped)
	require.Nil(t, h.sup.Progress(), "no progress without workers")
}

func TestCheckpointQueueDropsOldest(t *testing.T) {
	h := newSupervisor(t)
	h.sup.Assign(h.assignment("train", 1, "hang"))
	h.expect("train", 1, wRunning)
	for step := uint64(1); step <= checkpointQueueSize+1; step++ {
		require.NoError(t, h.sup.reportCheckpoint("train", 1, step, fmt.Sprintf("/ckpt/step-%d", step), time.Now()))
	}
	require.False(t, h.sup.queueCheckpoint(&rdzvv1.CheckpointReport{Job: "train", Generation: 1, Step: 100}, false),
		"a scanned checkpoint waits for the next scan rather than push one out")

	got := h.queuedCheckpoints()
	require.Len(t, got, checkpointQueueSize)
	require.EqualValues(t, 2, got[0].GetStep(), "the oldest report made room")
	require.EqualValues(t, checkpointQueueSize+1, got[len(got)-1].GetStep())

	h.sup.mu.Lock()
	w := h.sup.cur
	h.sup.mu.Unlock()
	require.True(t, h.sup.markReported(w, 1), "the dropped step can be found by the scanner again")
	require.False(t, h.sup.markReported(w, 2))
}

func TestProgressFilter(t *testing.T) {
	p := func(job string, gen, step uint64, at int64) *rdzvv1.Progress {
		return &rdzvv1.Progress{Job: job, Generation: gen, Step: step, At: timestamppb.New(time.Unix(at, 0))}
	}
	var f progressFilter
	for i, tt := range []struct {
		p    *rdzvv1.Progress
		want bool
	}{
		{nil, false},
		{p("train", 1, 10, 1), true},
		{p("train", 1, 10, 1), false},
		{p("train", 1, 10, 2), false}, // only the step counts
		{nil, false},
		{p("train", 1, 11, 3), true},
		{p("train", 2, 11, 4), true},
		{p("eval", 2, 11, 5), true},
		{p("eval", 2, 11, 5), false},
	} {
		require.Equal(t, tt.want, f.changed(tt.p), "input %d: %v", i, tt.p)
	}
}

// pythonEnv puts the examples directory on Python's path without leaving
// bytecode caches in the source tree.
func pythonEnv(t *testing.T) []string {
	t.Helper()
	examples, err := filepath.Abs("../examples")
	require.NoError(t, err)
	return []string{"PYTHONPATH=" + examples, "PYTHONDONTWRITEBYTECODE=1"}
}

// runPython runs code with pythonEnv, PATH and env as its whole
// environment.
func runPython(t *testing.T, code string, env ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(python, "-c", code)
	cmd.Env = append(append(pythonEnv(t), "PATH="+os.Getenv("PATH")), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

func TestPythonHelper(t *testing.T) {
	needPython(t)
	h := newSupervisor(t)
	ckpt := t.TempDir()
	makeTree(t, ckpt, "step-8/COMPLETE")
	live := reportEndpoint(t, h).Listener.Addr().String()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := closed.Addr().String()
	require.NoError(t, closed.Close())

	const warning = "rdzv_report: step report to the rdzv agent failed (not repeated): "
	tests := []struct {
		name string
		code string
		// addr is RDZV_AGENT_ADDR, unset when empty.
		addr       string
		staleGen   bool
		wantStep   uint64 // 0: no progress
		wantCkpt   bool
		wantStderr string // with REPORTED and RUNNING for the generations
	}{
		{name: "reports the step", code: `import rdzv_report; rdzv_report.report_step(1)`, addr: live, wantStep: 1},
		{name: "rate limited", code: `import rdzv_report; rdzv_report.report_step(2); rdzv_report.report_step(9)`, addr: live, wantStep: 2},
		{name: "force sends anyway", code: `import rdzv_report; rdzv_report.report_step(2); rdzv_report.report_step(9, force=True)`, addr: live, wantStep: 9},
		{name: "reports a checkpoint", code: fmt.Sprintf(`import rdzv_report; rdzv_report.report_checkpoint(8, %q)`, ckpt+"/step-8"),
			addr: live, wantStep: 8, wantCkpt: true},
		{name: "silent without rdzv", code: `import rdzv_report; rdzv_report.report_step(1, force=True); rdzv_report.report_checkpoint(1, "/nope")`},
		{name: "stale generation warns once and carries on",
			code: `import rdzv_report` + strings.Repeat(`; rdzv_report.report_step(7, force=True)`, 3) + `; print("still training")`,
			addr: live, staleGen: true,
			wantStderr: warning + "agent answered 409: job train generation REPORTED is not running on this node, which runs job train generation RUNNING\n"},
		{name: "agent unreachable", code: `import rdzv_report; rdzv_report.report_step(7); rdzv_report.report_step(8, force=True); print("still training")`,
			addr: dead, wantStderr: warning + "[Errno 111] Connection refused\n"},
		{name: "bad step warns", code: `import rdzv_report; rdzv_report.report_step("seven", force=True); print("still training")`,
			addr: live, wantStderr: warning + "invalid literal for int() with base 10: 'seven'\n"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A generation per case, so that each starts without progress.
			gen := uint64(i + 2)
			h.sup.Assign(h.assignment("train", gen, "hang"))
			if i > 0 {
				h.expect("train", gen-1, wStopped)
			}
			h.expect("train", gen, wRunning)
			var env []string
			if tt.addr != "" {
				env = append(env, "RDZV_AGENT_ADDR="+tt.addr)
			}
			reportGen := gen
			if tt.staleGen {
				reportGen--
			}
			env = append(env, "RDZV_JOB=train", fmt.Sprintf("RDZV_GENERATION=%d", reportGen))

			stdout, stderr, err := runPython(t, tt.code, env...)
			require.NoError(t, err, "stderr: %s", stderr)
			if tt.wantStderr == "" {
				require.Empty(t, stderr)
				require.Empty(t, stdout)
			} else {
				gens := strings.NewReplacer("REPORTED", strconv.FormatUint(reportGen, 10), "RUNNING", strconv.FormatUint(gen, 10))
				require.Equal(t, gens.Replace(tt.wantStderr), stderr)
				require.Equal(t, "still training\n", stdout)
			}
			if tt.wantStep == 0 {
				require.Nil(t, h.sup.Progress())
			} else {
				require.Equal(t, tt.wantStep, h.sup.Progress().GetStep())
			}
			var want []*rdzvv1.CheckpointReport
			if tt.wantCkpt {
				want = append(want, &rdzvv1.CheckpointReport{Job: "train", Generation: gen, Step: 8, Path: ckpt + "/step-8", Source: "helper"})
			}
			requireProto(t, want, h.queuedCheckpoints())
		})
	}
}

// fakeController accepts one agent, assigns it one job and records what
// the agent sends.
type fakeController struct {
	rdzvv1.UnimplementedAgentServiceServer
	registered *rdzvv1.Registered
	assignment *rdzvv1.Assignment
	got        chan *rdzvv1.ConnectRequest
	// chatter, when set, is sent every 20ms after the assignment: a
	// controller that keeps talking but acknowledges no heartbeat.
	chatter *rdzvv1.ConnectResponse
}

// serve runs the fake controller until the test ends and returns its
// address.
func (f *fakeController) serve(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	rdzvv1.RegisterAgentServiceServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

func (f *fakeController) Connect(stream grpc.BidiStreamingServer[rdzvv1.ConnectRequest, rdzvv1.ConnectResponse]) error {
	if err := stream.Send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_Registered{Registered: f.registered}}); err != nil {
		return err
	}
	if f.assignment != nil {
		if err := stream.Send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_Assignment{Assignment: f.assignment}}); err != nil {
			return err
		}
	}
	if f.chatter != nil {
		// The only sender from here on; Recv below runs beside it.
		go func() {
			ticker := time.NewTicker(20 * time.Millisecond)
			defer ticker.Stop()
			for {
				select {
				case <-stream.Context().Done():
					return
				case <-ticker.C:
					if stream.Send(f.chatter) != nil {
						return
					}
				}
			}
		}()
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			return nil
		}
		select {
		case f.got <- m:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// trainScript stands in for train.py: every step is reported, rank 0's
// checkpoints too (step 4's is left for the scanner), then it idles long
// enough for several heartbeats with nothing new.
const trainScript = `
import os, time, rdzv_report
ckpt = os.environ["RDZV_CHECKPOINT_DIR"]
for step in range(1, 7):
    rdzv_report.report_step(step, force=True)
    if step % 2 == 0:
        os.makedirs(os.path.join(ckpt, "step-%d" % step))
        open(os.path.join(ckpt, "step-%d" % step, "COMPLETE"), "w").close()
        if step != 4:
            rdzv_report.report_checkpoint(step, os.path.join(ckpt, "step-%d" % step))
    time.sleep(0.1)
time.sleep(0.3)
`

// TestAgentForwardsReports runs the whole path: a worker reports through
// the Python helper to the agent's endpoint, and the agent forwards to the
// controller.
func TestAgentForwardsReports(t *testing.T) {
	needPython(t)
	env := map[string]string{}
	for _, kv := range pythonEnv(t) {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	torchrun := filepath.Join(t.TempDir(), "torchrun")
	require.NoError(t, os.WriteFile(torchrun, []byte(fakeTorchrun), 0o755))
	ckpt := t.TempDir()

	fc := &fakeController{
		registered: &rdzvv1.Registered{HeartbeatIntervalMs: 25, HeartbeatTimeoutMs: 5000},
		assignment: &rdzvv1.Assignment{
			Spec: &rdzvv1.JobSpec{
				Name: "train", NodesMin: 1, NodesMax: 1, ProcsPerNode: 1,
				Command: []string{"train.py", "py", "-c", trainScript}, Workdir: t.TempDir(),
				Env: env, LauncherTorchrun: torchrun, CheckpointDir: ckpt,
			},
			Generation: 1, Nnodes: 1, ProcsPerNode: 1, MasterAddr: "127.0.0.1", MasterPort: 29500,
		},
		got: make(chan *rdzvv1.ConnectRequest, 4096),
	}
	cfg := DefaultConfig()
	cfg.Controller, cfg.NodeName, cfg.StateDir = fc.serve(t), "node-a", t.TempDir()
	runAsSelf(&cfg)
	cfg.Insecure = true // the fake controller serves plaintext
	cfg.GossipPort = 0
	a, err := New(cfg, zaptest.NewLogger(t), gpu.Fake{}, fakeNet{ifaces: []netif.Interface{lo}}, ExecSpawner{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	var (
		msgs      []*rdzvv1.ConnectRequest
		final     *rdzvv1.WorkerStatus
		timeout   = time.After(waitTimeout)
		heartbeat = true // registration counts as the first
	)
	for final == nil {
		select {
		case m := <-fc.got:
			msgs = append(msgs, m)
			switch {
			case m.GetHeartbeat() != nil:
				heartbeat = true
			case m.GetProgress() != nil:
				require.True(t, heartbeat, "two progress messages in one heartbeat interval: %v", msgs)
				heartbeat = false
			case m.GetWorkerStatus().GetState() == wSucceeded:
				final = m.GetWorkerStatus()
			}
		case <-timeout:
			require.FailNow(t, "the job never finished", "got %v", msgs)
		}
	}
	require.NotNil(t, final.GetExitedAt())

	var steps []uint64
	var checkpoints []*rdzvv1.CheckpointReport
	for _, m := range msgs {
		if p := m.GetProgress(); p != nil {
			require.Equal(t, "train", p.GetJob())
			require.EqualValues(t, 1, p.GetGeneration())
			steps = append(steps, p.GetStep())
		}
		if c := m.GetCheckpoint(); c != nil {
			checkpoints = append(checkpoints, c)
		}
	}
	require.NotEmpty(t, steps)
	require.EqualValues(t, 6, steps[len(steps)-1], "the last step reached the controller")
	for i := 1; i < len(steps); i++ {
		require.Greater(t, steps[i], steps[i-1], "progress is sent only when it changed: %v", steps)
	}

	bySource := map[string][]uint64{}
	for _, c := range checkpoints {
		require.Equal(t, filepath.Join(ckpt, fmt.Sprintf("step-%d", c.GetStep())), c.GetPath())
		bySource[c.GetSource()] = append(bySource[c.GetSource()], c.GetStep())
	}
	require.Equal(t, []uint64{2, 6}, bySource["helper"])
	// Whether a scan saw step 2 or 6 between its marker and its report is
	// timing; TestSupervisorScanSkipsHelperReports pins that down.
	require.Contains(t, bySource["scan"], uint64(4), "the scanner finds what the helper did not report")
	seen := map[uint64]bool{}
	for _, step := range bySource["scan"] {
		require.False(t, seen[step], "step %d scanned twice: %v", step, bySource["scan"])
		seen[step] = true
	}
}
