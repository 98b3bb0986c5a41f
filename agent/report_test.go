package agent

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/agent/gpu"
	"github.com/rdzv/rdzv/agent/netif"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// reportAt is the time the endpoint's clock gives every report.
var reportAt = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

const (
	stepsPhase  = rdzvv1.TrainingPhase_TRAINING_PHASE_STEPS
	savingPhase = rdzvv1.TrainingPhase_TRAINING_PHASE_SAVING
	donePhase   = rdzvv1.TrainingPhase_TRAINING_PHASE_DONE
)

// reportEndpoint serves the report endpoint for h's supervisor.
func reportEndpoint(t *testing.T, h *supHarness) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(newReportHandler(h.sup, zaptest.NewLogger(t), func() time.Time { return reportAt }))
	t.Cleanup(srv.Close)
	return srv
}

// token is the running workers' report token.
func (h *supHarness) token() []byte {
	w := h.sup.view.Load().cur
	require.NotNil(h.t, w, "no workers run")
	return w.token
}

// bearer is the Authorization header carrying token.
func bearer(token []byte) string { return "Bearer " + hex.EncodeToString(token) }

// post sends a request with auth as its Authorization header, none when
// empty.
func post(t *testing.T, srv *httptest.Server, method, path, auth, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
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
	makeTree(t, root, "ckpt/step-10/COMPLETE", "ckpt/step-11/model.pt", "ckpt/.real/step-13/COMPLETE", "ckpt-evil/step-10/COMPLETE")
	for link, target := range map[string]string{
		"step-12": ".real/step-13",             // stays beneath
		"step-14": root + "/ckpt-evil/step-10", // absolute, out
		"step-15": "../ckpt-evil/step-10",      // relative, out
		"step-16": "../ckpt/step-10",           // out and back in: still out
		"step-17": "/root",                     // root's home, as in the review
	} {
		require.NoError(t, os.Symlink(target, filepath.Join(dir, link)))
	}
	a := h.assignment("train", 2, "hang")
	a.Spec.CheckpointDir = dir
	h.sup.Assign(a)
	h.expect("train", 2, wRunning)
	srv := reportEndpoint(t, h)
	auth := bearer(h.token())
	wrong := bytes.Repeat([]byte{0xab}, reportTokenBytes)

	ckpt := func(gen int, step, path string) string {
		return fmt.Sprintf(`{"job":"train","generation":%d,"step":%s,"path":%q}`, gen, step, path)
	}
	const (
		missing   = "report token missing: send the worker's RDZV_REPORT_TOKEN"
		malformed = "report token malformed: expected \"Authorization: Bearer\" and 64 hex digits"
		refused   = "report token not accepted: only the workers running on this node can report"
	)
	tests := []struct {
		name       string
		method     string
		path       string
		auth       string
		body       string
		wantStatus int
		wantBody   string
	}{
		{"step", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":40}`, http.StatusNoContent, ""},
		{"step zero", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":0}`, http.StatusNoContent, ""},
		{"unknown fields are ignored", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":41,"rank":3}`, http.StatusNoContent, ""},
		{"metrics", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":41,"metrics":{"loss":2.5,"train/lr":1e-4,"grad_norm":"Infinity"}}`, http.StatusNoContent, ""},
		{"older metrics are ignored", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":40,"metrics":{"loss":9}}`, http.StatusNoContent, ""},
		{"saving", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":41,"phase":"saving"}`, http.StatusNoContent, ""},
		{"done", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":41,"phase":"done"}`, http.StatusNoContent, ""},
		{"unknown phase", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":41,"phase":"eval"}`, http.StatusBadRequest,
			`phase: must be "saving", "done" or left out, got "eval"`},
		{"too many metrics", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":41,"metrics":{` + manyMetrics(wire.MaxMetrics+1) + `}}`,
			http.StatusBadRequest, "metrics: at most 16 are allowed, got 17"},
		{"long metric name", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":41,"metrics":{"` + strings.Repeat("l", wire.MaxMetricNameLength+1) + `":1}}`,
			http.StatusBadRequest, "must be at most 64 characters"},
		{"metric name with a space", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":41,"metrics":{"a b":1}}`,
			http.StatusBadRequest, `metrics: name "a b" must be`},
		{"metric not a number", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":41,"metrics":{"loss":"low"}}`,
			http.StatusBadRequest, `metrics["loss"]: must be a number, "NaN", "Infinity" or "-Infinity", got "low"`},
		{"metric out of range", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":41,"metrics":{"loss":1e400}}`,
			http.StatusBadRequest, `metrics["loss"]: must be a number`},
		{"metrics not an object", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":41,"metrics":[1]}`, http.StatusBadRequest, "not valid JSON"},
		{"phase on a checkpoint", "POST", "/v1/checkpoint", auth, `{"job":"train","generation":2,"step":10,"phase":"saving","path":"` + dir + `/step-10"}`,
			http.StatusBadRequest, "phase and metrics belong in a step report"},
		{"scheme in any case", "POST", "/v1/step", "bearer " + strings.ToUpper(hex.EncodeToString(h.token())), `{"job":"train","generation":2,"step":0}`, http.StatusNoContent, ""},

		{"no token", "POST", "/v1/step", "", `{"job":"train","generation":2,"step":900}`, http.StatusUnauthorized, missing},
		{"no token, checkpoint", "POST", "/v1/checkpoint", "", ckpt(2, "10", dir+"/step-10"), http.StatusUnauthorized, missing},
		{"wrong token", "POST", "/v1/step", bearer(wrong), `{"job":"train","generation":2,"step":900}`, http.StatusForbidden, refused},
		{"wrong token, checkpoint", "POST", "/v1/checkpoint", bearer(wrong), ckpt(2, "10", dir+"/step-10"), http.StatusForbidden, refused},
		{"wrong token, bad body", "POST", "/v1/step", bearer(wrong), `step=3`, http.StatusForbidden, refused},
		{"short token", "POST", "/v1/step", auth[:len(auth)-2], `{"job":"train","generation":2,"step":900}`, http.StatusUnauthorized, malformed},
		{"long token", "POST", "/v1/step", auth + "00", `{"job":"train","generation":2,"step":900}`, http.StatusUnauthorized, malformed},
		{"not hex", "POST", "/v1/step", "Bearer " + strings.Repeat("zz", reportTokenBytes), `{"job":"train","generation":2,"step":900}`, http.StatusUnauthorized, malformed},
		{"other scheme", "POST", "/v1/step", "Basic " + hex.EncodeToString(h.token()), `{"job":"train","generation":2,"step":900}`, http.StatusUnauthorized, malformed},
		{"token without scheme", "POST", "/v1/step", hex.EncodeToString(h.token()), `{"job":"train","generation":2,"step":900}`, http.StatusUnauthorized, malformed},

		{"stale generation", "POST", "/v1/step", auth, `{"job":"train","generation":1,"step":900}`, http.StatusConflict,
			"job train generation 1 is not running on this node: the report token is another generation's"},
		{"future generation", "POST", "/v1/step", auth, `{"job":"train","generation":3,"step":900}`, http.StatusConflict, "not running on this node"},
		{"job name with a path", "POST", "/v1/step", auth, `{"job":"../train","generation":2,"step":1}`, http.StatusBadRequest, "job: must be a DNS-1123 label"},
		{"missing job", "POST", "/v1/checkpoint", auth, `{"generation":2,"step":1,"path":"/x"}`, http.StatusBadRequest, "job: must be a DNS-1123 label"},
		{"missing generation", "POST", "/v1/step", auth, `{"job":"train","step":900}`, http.StatusConflict, "not running on this node"},
		{"wrong job", "POST", "/v1/step", auth, `{"job":"eval","generation":5,"step":900}`, http.StatusConflict, "job eval generation 5 is not running"},
		{"negative step", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":-1}`, http.StatusBadRequest, "step must be at least 0, got -1"},
		{"missing step", "POST", "/v1/step", auth, `{"job":"train","generation":2}`, http.StatusBadRequest, "step is required"},
		{"fractional step", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":1.5}`, http.StatusBadRequest, "not valid JSON"},
		{"not JSON", "POST", "/v1/step", auth, `step=3`, http.StatusBadRequest, "not valid JSON"},
		{"trailing data", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":3}{}`, http.StatusBadRequest, "not valid JSON"},
		{"oversized body", "POST", "/v1/step", auth, `{"job":"train","generation":2,"step":3,"pad":"` + strings.Repeat("x", maxReportBytes) + `"}`,
			http.StatusRequestEntityTooLarge, "exceeds 4096 bytes"},
		{"wrong method", "GET", "/v1/step", auth, "", http.StatusMethodNotAllowed, ""},
		{"unknown endpoint", "POST", "/v1/steps", auth, `{}`, http.StatusNotFound, ""},

		{"checkpoint", "POST", "/v1/checkpoint", auth, ckpt(2, "10", dir+"/step-10"), http.StatusNoContent, ""},
		{"checkpoint without marker, vouched for by the script", "POST", "/v1/checkpoint", auth, ckpt(2, "11", dir+"/step-11"), http.StatusNoContent, ""},
		{"symlink staying beneath", "POST", "/v1/checkpoint", auth, ckpt(2, "12", dir+"/step-12"), http.StatusNoContent, ""},
		{"checkpoint of a stale generation", "POST", "/v1/checkpoint", auth, ckpt(1, "10", dir+"/step-10"), http.StatusConflict, "not running on this node"},
		{"relative path", "POST", "/v1/checkpoint", auth, ckpt(2, "10", "ckpt/step-10"), http.StatusBadRequest, "path: must be an absolute path"},
		{"unclean path", "POST", "/v1/checkpoint", auth, ckpt(2, "10", dir+"/step-10/"), http.StatusBadRequest, "path: must be a clean path"},
		{"traversal", "POST", "/v1/checkpoint", auth, ckpt(2, "10", dir+"/../ckpt-evil/step-10"), http.StatusBadRequest, "path: must be a clean path"},
		{"sibling sharing a prefix", "POST", "/v1/checkpoint", auth, ckpt(2, "10", root+"/ckpt-evil/step-10"), http.StatusBadRequest, "path: must be inside " + dir},
		{"the directory itself", "POST", "/v1/checkpoint", auth, ckpt(2, "10", dir), http.StatusBadRequest, "path: must be inside " + dir},
		{"absolute symlink out", "POST", "/v1/checkpoint", auth, ckpt(2, "14", dir+"/step-14"), http.StatusBadRequest, "leads out of checkpoint.dir"},
		{"relative symlink out", "POST", "/v1/checkpoint", auth, ckpt(2, "15", dir+"/step-15"), http.StatusBadRequest, "leads out of checkpoint.dir"},
		{"symlink out and back in", "POST", "/v1/checkpoint", auth, ckpt(2, "16", dir+"/step-16"), http.StatusBadRequest, "leads out of checkpoint.dir"},
		{"symlink to /root", "POST", "/v1/checkpoint", auth, ckpt(2, "17", dir+"/step-17"), http.StatusBadRequest, "leads out of checkpoint.dir"},
		{"below a symlink to /root", "POST", "/v1/checkpoint", auth, ckpt(2, "17", dir+"/step-17/.ssh"), http.StatusBadRequest, "leads out of checkpoint.dir"},
		{"missing directory", "POST", "/v1/checkpoint", auth, ckpt(2, "12", dir+"/step-19"), http.StatusBadRequest, "no such file or directory"},
		{"a file", "POST", "/v1/checkpoint", auth, ckpt(2, "10", dir+"/step-10/COMPLETE"), http.StatusBadRequest, "not a directory"},
		{"missing path", "POST", "/v1/checkpoint", auth, `{"job":"train","generation":2,"step":10}`, http.StatusBadRequest, "path is required"},
		{"negative checkpoint step", "POST", "/v1/checkpoint", auth, ckpt(2, "-10", dir+"/step-10"), http.StatusBadRequest, "step must be at least 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := post(t, srv, tt.method, tt.path, tt.auth, tt.body)
			require.Equal(t, tt.wantStatus, status, body)
			require.Contains(t, body, tt.wantBody)
			// Whoever sent it, an answer names nothing of what runs here
			// beyond what the request itself said.
			if !strings.Contains(tt.body, `"generation":2`) {
				require.NotContains(t, body, "generation 2", "the running generation leaks")
			}
			if !strings.Contains(tt.body, "train") {
				require.NotContains(t, body, "train", "the running job's name leaks")
			}
		})
	}

	// The challenge says what to send.
	resp, err := srv.Client().Post(srv.URL+"/v1/step", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Equal(t, `Bearer realm="rdzv worker reports"`, resp.Header.Get("WWW-Authenticate"))

	// Only the accepted reports had an effect.
	requireProto(t, &rdzvv1.Progress{Job: "train", Generation: 2, Step: 41, At: timestamppb.New(reportAt), Phase: donePhase,
		Metrics: map[string]float64{"loss": 2.5, "train/lr": 1e-4, "grad_norm": math.Inf(1)}}, h.sup.Progress())
	requireProto(t, []*rdzvv1.CheckpointReport{
		{Job: "train", Generation: 2, Step: 10, Path: dir + "/step-10", Source: "helper"},
		{Job: "train", Generation: 2, Step: 11, Path: dir + "/step-11", Source: "helper"},
		{Job: "train", Generation: 2, Step: 12, Path: dir + "/step-12", Source: "helper"},
	}, h.queuedCheckpoints())
}

// manyMetrics is n metrics as JSON object members.
func manyMetrics(n int) string {
	m := make([]string, n)
	for i := range m {
		m[i] = fmt.Sprintf(`"m%d":%d`, i, i)
	}
	return strings.Join(m, ",")
}

// A node's phase: a save lasts until its checkpoint is complete or training
// goes past it, whichever rank says so; done is final.
func TestReportedPhases(t *testing.T) {
	type report struct {
		checkpoint bool
		step       uint64
		phase      rdzvv1.TrainingPhase
	}
	tests := []struct {
		name    string
		reports []report
		want    rdzvv1.TrainingPhase
	}{
		{"steps", []report{{step: 1, phase: stepsPhase}}, stepsPhase},
		{"saving", []report{{step: 1, phase: stepsPhase}, {step: 2, phase: savingPhase}}, savingPhase},
		{"another rank at the same step keeps saving", []report{{step: 2, phase: savingPhase}, {step: 2, phase: stepsPhase}}, savingPhase},
		{"another rank behind keeps saving", []report{{step: 2, phase: savingPhase}, {step: 1, phase: stepsPhase}}, savingPhase},
		{"the checkpoint's completion ends it", []report{{step: 2, phase: savingPhase}, {checkpoint: true, step: 2}}, stepsPhase},
		{"an older checkpoint does not", []report{{step: 2, phase: savingPhase}, {checkpoint: true, step: 1}}, savingPhase},
		{"a later step ends it", []report{{step: 2, phase: savingPhase}, {step: 3, phase: stepsPhase}}, stepsPhase},
		{"a later save moves it", []report{{step: 2, phase: savingPhase}, {step: 4, phase: savingPhase}, {checkpoint: true, step: 2}}, savingPhase},
		{"done", []report{{step: 2, phase: stepsPhase}, {step: 3, phase: donePhase}}, donePhase},
		{"done is final", []report{{step: 3, phase: donePhase}, {step: 3, phase: savingPhase}, {step: 4, phase: stepsPhase}}, donePhase},
		{"done while saving", []report{{step: 3, phase: savingPhase}, {step: 3, phase: donePhase}, {checkpoint: true, step: 3}}, donePhase},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &worker{}
			for _, r := range tt.reports {
				w.advance(r.step, reportAt)
				if r.checkpoint {
					w.saved(r.step)
				} else {
					w.enter(r.phase, r.step)
				}
			}
			require.Equal(t, tt.want, w.phase)
		})
	}
}

func TestReportWithoutCheckpointDir(t *testing.T) {
	h := newSupervisor(t)
	h.sup.Assign(h.assignment("train", 1, "hang"))
	h.expect("train", 1, wRunning)
	srv := reportEndpoint(t, h)
	elsewhere := t.TempDir()
	status, body := post(t, srv, "POST", "/v1/checkpoint", bearer(h.token()), fmt.Sprintf(`{"job":"train","generation":1,"step":5,"path":%q}`, elsewhere))
	require.Equal(t, http.StatusBadRequest, status, body)
	require.Equal(t, "this job has no checkpoint.dir, and checkpoint reports need one: "+
		"set checkpoint.dir in the job file to the directory the checkpoints are saved under\n", body)
	require.Empty(t, h.queuedCheckpoints())
	require.Nil(t, h.sup.Progress(), "a refused checkpoint is no progress either")
}

func TestReportWithNoWorkers(t *testing.T) {
	h := newSupervisor(t)
	srv := reportEndpoint(t, h)
	for _, auth := range []string{"", bearer(make([]byte, reportTokenBytes))} {
		status, _ := post(t, srv, "POST", "/v1/step", auth, `{"job":"train","generation":1,"step":1}`)
		require.Contains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, status)
	}
	require.Nil(t, h.sup.Progress())
}

// TestTokenIsPerGeneration: the token of generation 1's workers is worth
// nothing once generation 2 runs, even for reports naming generation 2.
func TestTokenIsPerGeneration(t *testing.T) {
	h := newSupervisor(t)
	h.sup.Assign(h.assignment("train", 1, "hang"))
	h.expect("train", 1, wRunning)
	first := h.token()
	require.Len(t, first, reportTokenBytes)
	h.sup.Assign(h.assignment("train", 2, "hang"))
	h.expect("train", 1, wStopped)
	h.expect("train", 2, wRunning)
	second := h.token()
	require.NotEqual(t, first, second)

	srv := reportEndpoint(t, h)
	status, body := post(t, srv, "POST", "/v1/step", bearer(first), `{"job":"train","generation":2,"step":1}`)
	require.Equal(t, http.StatusForbidden, status, body)
	require.ErrorIs(t, h.sup.reportStep(first, "train", 2, 1, stepsPhase, nil, reportAt), errTokenRefused)
	require.Nil(t, h.sup.Progress())
	status, body = post(t, srv, "POST", "/v1/step", bearer(second), `{"job":"train","generation":2,"step":1}`)
	require.Equal(t, http.StatusNoContent, status, body)
}

// TestAdoptedWorkersKeepTheirToken: the next agent accepts the adopted
// workers' token, and a worker whose shim kept none (started by an agent
// before report tokens) cannot report at all.
func TestAdoptedWorkersKeepTheirToken(t *testing.T) {
	for _, tokenKept := range []bool{true, false} {
		t.Run(fmt.Sprintf("token kept %v", tokenKept), func(t *testing.T) {
			h := newSupervisor(t, withRestartGrace(time.Minute))
			h.sup.Assign(h.assignment("train", 1, "hang"))
			h.expect("train", 1, wRunning)
			token := h.token()
			handOver(t, h, true)
			if !tokenKept {
				require.NoError(t, os.Remove(filepath.Join(h.stateDir, "workers", "train.1", shimTokenFile)))
			}
			next := h.successor()
			require.True(t, next.sup.Running("train"))
			err := next.sup.reportStep(token, "train", 1, 7, stepsPhase, nil, reportAt)
			if tokenKept {
				require.NoError(t, err)
				require.EqualValues(t, 7, next.sup.Progress().GetStep())
			} else {
				require.ErrorIs(t, err, errTokenRefused)
				require.ErrorIs(t, next.sup.reportStep(nil, "train", 1, 7, stepsPhase, nil, reportAt), errTokenRefused)
				require.Nil(t, next.sup.Progress())
			}
			next.sup.Stop("train", 1, "done")
			next.expect("train", 1, wStopped)
		})
	}
}

// nobody is the unprivileged user the local-attacker tests act as.
var nobody = &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{65534}}

// needRoot skips tests that switch users where they cannot.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("switching users needs root")
	}
}

// openToAll lets every user through dir and the directories above it up to
// the system's temporary directory (t.TempDir makes the first below 0700).
func openToAll(t *testing.T, dir string) {
	t.Helper()
	for d := dir; wire.Within(os.TempDir(), d); d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755))
	}
}

// TestCheckpointPathAsJobUser checks reported paths as an unprivileged job
// user would see them: what that user cannot read is refused, with the same
// answer whether or not it exists, so the agent's root view leaks nothing.
func TestCheckpointPathAsJobUser(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	dir := filepath.Join(root, "ckpt")
	makeTree(t, root, "ckpt/step-1/COMPLETE", "ckpt/private/step-2/COMPLETE", "ckpt/unlistable/")
	openToAll(t, dir)
	makeTree(t, dir, "step-3/")
	require.NoError(t, os.Chmod(filepath.Join(dir, "private"), 0o700))
	require.NoError(t, os.Chmod(filepath.Join(dir, "step-3"), 0o311))
	hidden := filepath.Join(root, "locked", "ckpt")
	makeTree(t, hidden, "step-1/")
	require.NoError(t, os.Chmod(filepath.Dir(hidden), 0o700))

	tests := []struct {
		name    string
		dir     string
		path    string
		cred    *syscall.Credential
		wantErr string
	}{
		{"readable", dir, dir + "/step-1", nobody, ""},
		{"as root", dir, dir + "/private/step-2", nil, ""},
		{"in a directory the user cannot enter", dir, dir + "/private/step-2", nobody, "permission denied"},
		{"missing there: the same answer", dir, dir + "/private/step-9", nobody, "permission denied"},
		{"a directory the user cannot list", dir, dir + "/step-3", nobody, "permission denied"},
		{"checkpoint.dir the user cannot reach", hidden, hidden + "/step-1", nobody, "permission denied"},
		{"checkpoint.dir missing there: the same answer", hidden + "-nope", hidden + "-nope/step-1", nobody, "permission denied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkCheckpointPath(tt.dir, tt.path, tt.cred)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, fs.ErrPermission)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// TestLocalUserCannotReport is the local attacker: an unprivileged user on
// the node, here nobody, posting to a real report endpoint for a running
// job. Without the token it is refused and changes nothing, and it cannot
// read the token from the workers' environment.
func TestLocalUserCannotReport(t *testing.T) {
	needRoot(t)
	needPython(t)
	h := newSupervisor(t)
	dir := t.TempDir()
	makeTree(t, dir, "step-5/COMPLETE")
	openToAll(t, dir)
	a := h.assignment("train", 3, "hang")
	a.Spec.CheckpointDir = dir
	h.sup.Assign(a)
	h.expect("train", 3, wRunning)
	pid := h.record("train", 3).PID

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := newReportServer(h.sup, newAgentMetrics().reports, zaptest.NewLogger(t))
	served := make(chan error, 1)
	go func() { served <- srv.serve(ln) }()
	defer func() {
		srv.shutdown()
		require.NoError(t, <-served)
	}()

	// What the attacker runs: read the workers' environment, then post a
	// step and a checkpoint as the helper would, with whatever token it has.
	const attack = `
import json, os, sys, urllib.request, urllib.error
addr, pid, ckpt, token = sys.argv[1:5]
try:
    open("/proc/%s/environ" % pid, "rb").read()
    print("environ: read")
except OSError as e:
    print("environ:", e.strerror)
for kind, body in (("step", {"step": 999}), ("checkpoint", {"step": 5, "path": ckpt})):
    body.update(job="train", generation=3)
    req = urllib.request.Request("http://%s/v1/%s" % (addr, kind), data=json.dumps(body).encode(), method="POST")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        print(kind, urllib.request.urlopen(req, timeout=5).status)
    except urllib.error.HTTPError as e:
        print(kind, e.code, e.read().decode().strip())
`
	for _, tt := range []struct {
		name  string
		token string
		want  string
	}{
		{"no token", "", "environ: Permission denied\n" +
			"step 401 report token missing: send the worker's RDZV_REPORT_TOKEN as \"Authorization: Bearer <token>\" (the rdzv Python package does)\n" +
			"checkpoint 401 report token missing: send the worker's RDZV_REPORT_TOKEN as \"Authorization: Bearer <token>\" (the rdzv Python package does)\n"},
		{"guessed token", strings.Repeat("0", 2*reportTokenBytes), "environ: Permission denied\n" +
			"step 403 " + errTokenRefused.Error() + "\n" +
			"checkpoint 403 " + errTokenRefused.Error() + "\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(python, "-c", attack, ln.Addr().String(), strconv.Itoa(pid), dir+"/step-5", tt.token)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "PYTHONDONTWRITEBYTECODE=1"}
			cmd.Dir = "/"
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: nobody}
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			require.Equal(t, tt.want, string(out))
		})
	}
	require.Nil(t, h.sup.Progress(), "no step was recorded")
	require.Empty(t, h.queuedCheckpoints(), "no checkpoint was recorded")
}

func TestProgressFollowsCurrentWorker(t *testing.T) {
	h := newSupervisor(t)
	h.sup.Assign(h.assignment("train", 1, "hang"))
	h.expect("train", 1, wRunning)
	require.Nil(t, h.sup.Progress(), "no progress before the first report")

	t0 := time.Now()
	tok := h.token()
	require.NoError(t, h.sup.reportStep(tok, "train", 1, 50, stepsPhase, nil, t0))
	require.NoError(t, h.sup.reportStep(tok, "train", 1, 49, stepsPhase, nil, t0.Add(time.Second)), "a slower rank's step is accepted")
	requireProto(t, &rdzvv1.Progress{Job: "train", Generation: 1, Step: 50, At: timestamppb.New(t0), Phase: stepsPhase}, progressAged(t, h.sup, t0),
		"the highest step is kept, with the time it was reached")
	require.NoError(t, h.sup.reportCheckpoint(tok, "train", 1, 60, "/ckpt/step-60", t0.Add(2*time.Second)))
	requireProto(t, &rdzvv1.Progress{Job: "train", Generation: 1, Step: 60, At: timestamppb.New(t0.Add(2 * time.Second)), Phase: stepsPhase}, h.sup.Progress(),
		"a saved checkpoint is progress too")

	h.sup.Assign(h.assignment("train", 2, "hang"))
	h.expect("train", 1, wStopped)
	h.expect("train", 2, wRunning)
	require.Nil(t, h.sup.Progress(), "a new generation starts without progress")
	require.ErrorIs(t, h.sup.reportStep(tok, "train", 1, 70, stepsPhase, nil, t0), errTokenRefused)
	require.ErrorIs(t, h.sup.reportStep(h.token(), "train", 1, 70, stepsPhase, nil, t0), errNotRunning)
	require.NoError(t, h.sup.reportStep(h.token(), "train", 2, 3, stepsPhase, nil, t0))
	require.EqualValues(t, 3, h.sup.Progress().GetStep())

	h.sup.Stop("train", 2, "done")
	h.expect("train", 2, wStopped)
	require.Nil(t, h.sup.Progress(), "no progress without workers")
}

// progressAged is sup's progress, whose step was reached at at (on the
// real clock the supervisor runs on), with its age checked and then
// cleared so that the rest compares exactly.
func progressAged(t *testing.T, sup *Supervisor, at time.Time) *rdzvv1.Progress {
	t.Helper()
	atLeast := time.Since(at)
	p := sup.Progress()
	atMost := time.Since(at)
	require.NotNil(t, p)
	age := p.GetAge().AsDuration()
	require.True(t, age >= atLeast && age <= atMost, "age %s, want %s to %s", age, atLeast, atMost)
	p.Age = nil
	return p
}

func TestCheckpointQueueDropsOldest(t *testing.T) {
	h := newSupervisor(t)
	h.sup.Assign(h.assignment("train", 1, "hang"))
	h.expect("train", 1, wRunning)
	for step := uint64(1); step <= checkpointQueueSize+1; step++ {
		require.NoError(t, h.sup.reportCheckpoint(h.token(), "train", 1, step, fmt.Sprintf("/ckpt/step-%d", step), time.Now()))
	}
	require.False(t, h.sup.queueCheckpoint(&rdzvv1.CheckpointReport{Job: "train", Generation: 1, Step: 100}, false),
		"a scanned checkpoint waits for the next scan rather than push one out")

	got := h.queuedCheckpoints()
	require.Len(t, got, checkpointQueueSize)
	require.EqualValues(t, 2, got[0].GetStep(), "the oldest report made room")
	require.EqualValues(t, checkpointQueueSize+1, got[len(got)-1].GetStep())

	w := h.sup.view.Load().cur
	require.True(t, w.markReported(1), "the dropped step can be found by the scanner again")
	require.False(t, w.markReported(2))
}

func TestProgressFilter(t *testing.T) {
	p := func(job string, gen, step uint64, at int64) *rdzvv1.Progress {
		return &rdzvv1.Progress{Job: job, Generation: gen, Step: step, At: timestamppb.New(time.Unix(at, 0)), Phase: stepsPhase}
	}
	with := func(p *rdzvv1.Progress, phase rdzvv1.TrainingPhase, metrics map[string]float64) *rdzvv1.Progress {
		p.Phase, p.Metrics = phase, metrics
		return p
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
		{with(p("eval", 2, 11, 5), savingPhase, nil), true},
		{with(p("eval", 2, 11, 6), savingPhase, nil), false},
		{with(p("eval", 2, 11, 6), savingPhase, map[string]float64{"loss": math.NaN()}), true},
		{with(p("eval", 2, 11, 7), savingPhase, map[string]float64{"loss": math.NaN()}), false}, // NaN is no news
		{with(p("eval", 2, 11, 7), savingPhase, map[string]float64{"loss": 1}), true},
		{with(p("eval", 2, 11, 7), donePhase, map[string]float64{"loss": 1}), true},
	} {
		require.Equal(t, tt.want, f.changed(tt.p), "input %d: %v", i, tt.p)
	}
}

// pythonEnv puts the rdzv Python package on Python's path without leaving
// bytecode caches in the source tree.
func pythonEnv(t *testing.T) []string {
	t.Helper()
	src, err := filepath.Abs("../python/src")
	require.NoError(t, err)
	return []string{"PYTHONPATH=" + src, "PYTHONDONTWRITEBYTECODE=1"}
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

	const warning = "rdzv: step report to the rdzv agent failed (not repeated): "
	tests := []struct {
		name string
		code string
		// addr is RDZV_AGENT_ADDR, unset when empty.
		addr     string
		staleGen bool
		// token is RDZV_REPORT_TOKEN: "" the workers', "-" unset.
		token      string
		wantStep   uint64 // 0: no progress
		wantCkpt   bool
		wantStderr string // with REPORTED for the generation reported
		// wantPhase and wantMetrics are the progress's, when wantStep is set.
		wantPhase   rdzvv1.TrainingPhase
		wantMetrics map[string]float64
	}{
		{name: "reports the step", code: `import rdzv; rdzv.report_step(1)`, addr: live, wantStep: 1},
		{name: "rate limited", code: `import rdzv; rdzv.report_step(2); rdzv.report_step(9)`, addr: live, wantStep: 2},
		{name: "force sends anyway", code: `import rdzv; rdzv.report_step(2); rdzv.report_step(9, force=True)`, addr: live, wantStep: 9},
		{name: "reports a checkpoint", code: fmt.Sprintf(`import rdzv; rdzv.checkpoint_complete(%q, 8)`, ckpt+"/step-8"),
			addr: live, wantStep: 8, wantCkpt: true},
		{name: "metrics", code: `import rdzv; rdzv.report_step(4, loss=2.5, **{"train/lr": 1e-4}, g=float("nan"), h=float("-inf"))`,
			addr: live, wantStep: 4, wantMetrics: map[string]float64{"loss": 2.5, "train/lr": 1e-4, "g": math.NaN(), "h": math.Inf(-1)}},
		{name: "saving", code: `import rdzv; rdzv.report_step(7)` + "\nwith rdzv.saving(8): pass", addr: live, wantStep: 8, wantPhase: savingPhase},
		{name: "a save ends with its checkpoint", code: fmt.Sprintf(`import rdzv; rdzv.checkpoint_begin(8); rdzv.checkpoint_complete(%q, 8)`, ckpt+"/step-8"),
			addr: live, wantStep: 8, wantCkpt: true},
		{name: "final", code: `import rdzv; rdzv.report_step(11); rdzv.report_step(12, final=True, loss=0.5)`, addr: live,
			wantStep: 12, wantPhase: donePhase, wantMetrics: map[string]float64{"loss": 0.5}},
		{name: "done", code: `import rdzv; rdzv.report_step(13); rdzv.report_done()`, addr: live, wantStep: 13, wantPhase: donePhase},
		{name: "without the token, refused", code: `import rdzv; rdzv.report_step(3); print("still training")`, addr: live, token: "-",
			wantStderr: warning + "agent answered 401: report token missing: send the worker's RDZV_REPORT_TOKEN as \"Authorization: Bearer <token>\" (the rdzv Python package does)\n"},
		{name: "with another token, refused", code: `import rdzv; rdzv.report_step(3); print("still training")`, addr: live,
			token: strings.Repeat("ab", reportTokenBytes), wantStderr: warning + "agent answered 403: " + errTokenRefused.Error() + "\n"},
		{name: "silent without rdzv", code: fmt.Sprintf(`import rdzv; rdzv.report_step(1, force=True); rdzv.checkpoint_complete(%q, 1)`, ckpt+"/step-8")},
		{name: "stale generation warns once and carries on",
			code: `import rdzv` + strings.Repeat(`; rdzv.report_step(7, force=True)`, 3) + `; print("still training")`,
			addr: live, staleGen: true,
			wantStderr: warning + "agent answered 409: job train generation REPORTED is not running on this node: the report token is another generation's\n"},
		{name: "agent unreachable", code: `import rdzv; rdzv.report_step(7); rdzv.report_step(8, force=True); print("still training")`,
			addr: dead, wantStderr: warning + "[Errno 111] Connection refused\n"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A generation per case, so that each starts without progress.
			gen := uint64(i + 2)
			a := h.assignment("train", gen, "hang")
			a.Spec.CheckpointDir = ckpt
			h.sup.Assign(a)
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
			switch tt.token {
			case "":
				env = append(env, "RDZV_REPORT_TOKEN="+hex.EncodeToString(h.token()))
			case "-":
			default:
				env = append(env, "RDZV_REPORT_TOKEN="+tt.token)
			}

			stdout, stderr, err := runPython(t, tt.code, env...)
			require.NoError(t, err, "stderr: %s", stderr)
			if tt.wantStderr == "" {
				require.Empty(t, stderr)
				require.Empty(t, stdout)
			} else {
				require.Equal(t, strings.ReplaceAll(tt.wantStderr, "REPORTED", strconv.FormatUint(reportGen, 10)), stderr)
				require.Equal(t, "still training\n", stdout)
			}
			if tt.wantStep == 0 {
				require.Nil(t, h.sup.Progress())
			} else {
				p := h.sup.Progress()
				require.Equal(t, tt.wantStep, p.GetStep())
				phase := tt.wantPhase
				if phase == rdzvv1.TrainingPhase_TRAINING_PHASE_UNSPECIFIED {
					phase = stepsPhase
				}
				require.Equal(t, phase, p.GetPhase())
				require.Len(t, p.GetMetrics(), len(tt.wantMetrics))
				for name, want := range tt.wantMetrics {
					require.True(t, sameMetric(want, p.GetMetrics()[name]), "%s: %v, want %v", name, p.GetMetrics()[name], want)
				}
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
import os, time, rdzv
ckpt = os.environ["RDZV_CHECKPOINT_DIR"]
for step in range(1, 7):
    rdzv.report_step(step, force=True)
    if step % 2 == 0:
        os.makedirs(os.path.join(ckpt, "step-%d" % step))
        open(os.path.join(ckpt, "step-%d" % step, "COMPLETE"), "w").close()
        if step != 4:
            rdzv.checkpoint_complete(os.path.join(ckpt, "step-%d" % step), step)
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
	cfg.HTTP.Listen = ""
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
