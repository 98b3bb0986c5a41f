package controller_test

import (
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/dashboard"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// browser finds a Chromium to drive, or skips the test where none is
// installed, except in CI, which installs one (.ci/run).
func browser(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no chromium binary found, and CI must run the browser test: install Debian's chromium package (.ci/run does)")
	}
	t.Skip("no chromium binary found (install Debian's chromium package to run the dashboard's browser test)")
	return ""
}

// artifacts is where a test leaves files for people to look at:
// $RDZV_TEST_ARTIFACTS, or a temporary directory it logs.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("RDZV_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	dir = filepath.Join(dir, t.Name())
	require.NoError(t, os.MkdirAll(dir, 0o755))
	t.Logf("artifacts in %s", dir)
	return dir
}

// The dashboard in a real headless Chromium: a job that recovered once
// shows its incident's timeline, the overview shows each node's state,
// and the job's page follows the job live.
func TestDashboardInABrowser(t *testing.T) {
	chrome := browser(t)
	out := artifacts(t)
	c := newCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	gone := c.connectFake("node-c")
	gone.crash()
	c.waitNode("node-c", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST })

	c.startJob(c.recoverable("train", 2, 3))
	a1, b1 := a.run(), b.run()
	// Both RUNNING reports recorded before a's failure: b's, taken after it,
	// would be answered with a second stop (the job no longer runs).
	c.waitJob("train", func(j *rdzvv1.Job) bool { return allWorkers(j, rdzvv1.WorkerState_WORKER_STATE_RUNNING) })
	a.step(a1, 5)
	a.report(a1, rdzvv1.WorkerState_WORKER_STATE_FAILED, 1)
	b.expectStop(b1)
	a2, _ := a.run(), b.run()
	c.waitJob("train", func(j *rdzvv1.Job) bool { return allWorkers(j, rdzvv1.WorkerState_WORKER_STATE_RUNNING) })
	a.step(a2, 1)
	c.waitEvent("train", controller.EventRecovered)

	srv := httptest.NewServer(dashboard.New(c.ctl.ReadOnly(), c.log.Named("dashboard")))
	defer srv.Close()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1280, 1100))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	// Quality 100 is PNG (less is JPEG).
	// Bounds the whole browser session, so a hung browser fails the test
	// rather than the test binary's timeout.
	ctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
	defer cancel()

	var nodeStates map[string]string
	var overview []byte
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(`tr.node[data-node="node-c"]`),
		chromedp.Evaluate(`Object.fromEntries([...document.querySelectorAll("tr.node")].map(r => [r.dataset.node, r.dataset.state]))`, &nodeStates),
		chromedp.FullScreenshot(&overview, 100),
	))
	require.Equal(t, map[string]string{"node-a": "busy", "node-b": "busy", "node-c": "lost"}, nodeStates)
	require.NoError(t, os.WriteFile(filepath.Join(out, "overview.png"), overview, 0o644))

	var phases []string
	var page []byte
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(srv.URL+"/jobs/train"),
		chromedp.WaitVisible(`#incident-1 svg.timeline rect[data-phase="resume"]`),
		chromedp.Evaluate(`[...document.querySelectorAll("#incident-1 svg.timeline rect.phase")].map(r => r.dataset.phase)`, &phases),
		chromedp.FullScreenshot(&page, 100),
	))
	require.Equal(t, []string{"detect", "fence", "commit", "start", "resume"}, phases, "every phase of the recovery, in order")
	require.NoError(t, os.WriteFile(filepath.Join(out, "job.png"), page, 0o644))

	// Live: the page shows the job stopping without being reloaded, from
	// the event stream.
	var state string
	require.NoError(t, chromedp.Run(ctx, chromedp.WaitVisible(`#live.on`)))
	c.stopJob("train")
	require.NoError(t, chromedp.Run(ctx,
		chromedp.WaitVisible(`#job-state.state-stopping, #job-state.state-stopped`),
		chromedp.Text(`#job-state`, &state),
	))
	require.Contains(t, []string{"stopping", "stopped"}, state)
}
