package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/controller/keyring"
	"github.com/rdzv/rdzv/test/netns"
	"github.com/rdzv/rdzv/test/testpki"
)

const (
	agentHosts = 3
	// Debian's torchrun; the job's launcher ("torchrun" on PATH) finds it.
	torchrun = "/usr/bin/torchrun"

	controllerPort = "7070"
	// Short so that a node that fails to come back is noticed within the
	// test, and so that the restart test exercises re-registration.
	// Clusters may set their own (cluster.heartbeatTimeout).
	defaultHeartbeatTimeout = "5s"

	// Deadlines only keep a hang from stalling the run; none measures
	// performance, so they are generous for two busy cores.
	readyTimeout   = 90 * time.Second
	jobTimeout     = 3 * time.Minute
	commandTimeout = 30 * time.Second
	stopTimeout    = 30 * time.Second
	pollEvery      = 250 * time.Millisecond
)

// cluster is a controller on h0 and agents on h1..h3, all real binaries;
// a replicated cluster (newHACluster) has more hosts before the agents'.
type cluster struct {
	t   *testing.T
	net *netns.Cluster
	dir string
	// agentBase is the index of the first agent host, hosts the number of
	// agent hosts (agentHosts unless a test asks for more).
	agentBase, hosts int

	controllerBin, agentBin, ctlBin string
	// controllerAddr is where agents and rdzvctl reach the controller (a
	// comma-separated list with replicas).
	controllerAddr string
	controllerArgs []string
	controller     *netns.Proc
	agents         []*netns.Proc // agents[i] runs on agentHost(i)
	// heartbeatTimeout is the controller's --heartbeat-timeout,
	// heartbeatInterval its --heartbeat-interval when set, and agentArgs
	// extra flags for every agent; set them before starting.
	heartbeatTimeout  string
	heartbeatInterval string
	agentArgs         []string
	// controllerWrap and agentWrap, when set, run the daemons under a
	// wrapper command (the systemd units' sandboxes, systemd_test.go).
	controllerWrap []string
	agentWrap      func(i int) []string
	// killed marks the agent hosts whose processes a test killed on purpose.
	killed map[int]bool
	// pkiDir holds the cluster CA and every certificate, made by rdzvctl
	// pki at setup: the controller's, one per agent host, and the
	// operator's that rdzvctl uses (rdzvctl.crt, with ca.crt, so that
	// pkiDir is also rdzvctl's --tls-dir).
	pkiDir string
	// job is the job whose state the failure report shows.
	job string
}

// newCluster checks the prerequisites and creates the hosts; nothing runs
// on them yet.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	return newClusterHosts(t, 1)
}

// newClusterHosts is newCluster with infraHosts hosts (h0...) before the
// agent hosts, for controllers and etcd members.
func newClusterHosts(t *testing.T, infraHosts int) *cluster {
	t.Helper()
	return newClusterSized(t, infraHosts, agentHosts)
}

// newClusterSized is newClusterHosts with hosts agent hosts rather than
// agentHosts, for a test that needs more.
func newClusterSized(t *testing.T, infraHosts, hosts int) *cluster {
	t.Helper()
	binDir := os.Getenv("RDZV_BIN_DIR")
	if binDir == "" {
		netns.SkipOrFail(t, "e2e: RDZV_BIN_DIR is not set: run `make e2e`, or `make build` and set RDZV_BIN_DIR to the bin directory")
	}
	binDir, err := filepath.Abs(binDir)
	require.NoError(t, err)
	c := &cluster{t: t, dir: t.TempDir(), agentBase: infraHosts, hosts: hosts, heartbeatTimeout: defaultHeartbeatTimeout, killed: map[int]bool{}}
	for _, b := range []struct {
		path *string
		name string
	}{{&c.controllerBin, "rdzv-controller"}, {&c.agentBin, "rdzv-agent"}, {&c.ctlBin, "rdzvctl"}} {
		*b.path = filepath.Join(binDir, b.name)
		if info, err := os.Stat(*b.path); err != nil || info.Mode()&0o111 == 0 {
			netns.SkipOrFail(t, "e2e: %s is missing or not executable (RDZV_BIN_DIR=%s): run `make build`", *b.path, binDir)
		}
	}
	if _, err := os.Stat(torchrun); err != nil {
		netns.SkipOrFail(t, "e2e: %s is missing (apt-get install python3-torch)", torchrun)
	}
	c.net = netns.NewCluster(t, infraHosts+hosts, filepath.Join(c.dir, "proc-logs"))
	c.controllerAddr = c.controllerHost().IP + ":" + controllerPort
	c.pkiDir = filepath.Join(c.dir, "pki")
	c.pki(t, "init", "--dir", c.pkiDir)
	c.pki(t, "issue", "controller", "rdzv-controller", "--ip", c.controllerHost().IP, "--dir", c.pkiDir)
	for i := range hosts {
		c.pki(t, "issue", "agent", c.agentHost(i).Name, "--dir", c.pkiDir)
	}
	c.pki(t, "issue", "operator", "e2e", "--dir", c.pkiDir, "--out", filepath.Join(c.pkiDir, "rdzvctl"))
	return c
}

// pki runs `rdzvctl pki ARGS` here; it only writes files.
func (c *cluster) pki(t *testing.T, args ...string) string {
	t.Helper()
	return testpki.Run(t, c.ctlBin, args...)
}

// tlsArgs are a daemon's flags for the certificate of role and name.
func (c *cluster) tlsArgs(role, name string) []string {
	return testpki.DaemonArgs(c.pkiDir, role, name)
}

func (c *cluster) controllerHost() *netns.Host { return c.net.Host(0) }

// agentHost is the host of agent i: h1, h2, h3 (after the infrastructure
// hosts).
func (c *cluster) agentHost(i int) *netns.Host { return c.net.Host(c.agentBase + i) }

func (c *cluster) stateDir(i int) string { return filepath.Join(c.dir, c.agentHost(i).Name) }

// startEmbeddedController runs the controller with its own etcd, which
// listens only on a Unix socket in its data directory.
func (c *cluster) startEmbeddedController() {
	c.startController("--data-dir", c.controllerDataDir())
}

// controllerDataDir is the embedded-etcd controller's --data-dir.
func (c *cluster) controllerDataDir() string { return filepath.Join(c.dir, "controller-data") }

// secretsKeyArgs are the flags naming the secrets key file that every
// controller on external etcd shares, created on first use (only the
// embedded-etcd controller creates its own).
func (c *cluster) secretsKeyArgs() []string {
	path := filepath.Join(c.dir, "secrets.key")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		require.NoError(c.t, keyring.Create(path, time.Now()))
	}
	return []string{"--secrets-key-file", path}
}

func (c *cluster) startController(etcdArgs ...string) {
	c.t.Helper()
	c.controllerArgs = append([]string{"--listen", c.controllerAddr, "--heartbeat-timeout", c.heartbeatTimeout}, etcdArgs...)
	if c.heartbeatInterval != "" {
		c.controllerArgs = append(c.controllerArgs, "--heartbeat-interval", c.heartbeatInterval)
	}
	c.controllerArgs = append(c.controllerArgs, c.tlsArgs("controller", "rdzv-controller")...)
	c.controller = c.controllerHost().Start(c.t, "controller", nil, c.controllerArgv()...)
}

// controllerArgv is the controller's command line, wrapped if asked.
func (c *cluster) controllerArgv() []string {
	return append(slices.Clone(c.controllerWrap), append([]string{c.controllerBin}, c.controllerArgs...)...)
}

// restartController stops the controller with SIGTERM, as systemd would, and
// starts it again with the same flags and so the same data.
func (c *cluster) restartController() {
	t := c.t
	t.Helper()
	begin := time.Now()
	require.NoError(t, c.controller.Stop(syscall.SIGTERM))
	select {
	case <-c.controller.Exited():
	case <-time.After(stopTimeout):
		t.Fatalf("controller still running %s after SIGTERM", stopTimeout)
	}
	require.NoError(t, c.controller.Wait(), "controller did not exit cleanly on SIGTERM")
	t.Logf("e2e: controller exited %s after SIGTERM", time.Since(begin).Round(time.Millisecond))
	c.controller = c.controllerHost().Start(t, "controller", nil, c.controllerArgv()...)
}

// startAgents runs one agent per agent host without --node-name, so each
// must name itself after its hostname.
func (c *cluster) startAgents() {
	c.t.Helper()
	for i := range c.hosts {
		c.agents = append(c.agents, c.agentHost(i).Start(c.t, "agent", nil, c.agentArgv(i)...))
	}
}

// agentArgv runs workers as root (not the agent's default, nobody): train.py
// writes checkpoints into the test's root-owned directories.
func (c *cluster) agentArgv(i int) []string {
	argv := append([]string{c.agentBin, "--controller", c.controllerAddr, "--state-dir", c.stateDir(i), "--run-as", "root", "--allow-root"},
		c.tlsArgs("agent", c.agentHost(i).Name)...)
	argv = append(argv, c.agentArgs...)
	if c.agentWrap != nil {
		argv = append(c.agentWrap(i), argv...)
	}
	return argv
}

// restartAgent stops agent i with SIGTERM, as `systemctl restart` does, and
// starts it again with the same flags and state directory.
func (c *cluster) restartAgent(t *testing.T, i int) {
	t.Helper()
	begin := time.Now()
	require.NoError(t, c.agents[i].Stop(syscall.SIGTERM))
	select {
	case <-c.agents[i].Exited():
	case <-time.After(stopTimeout):
		t.Fatalf("agent on %s still running %s after SIGTERM", c.agentHost(i).Name, stopTimeout)
	}
	require.NoError(t, c.agents[i].Wait(), "agent did not exit cleanly on SIGTERM")
	t.Logf("e2e: agent on %s exited %s after SIGTERM", c.agentHost(i).Name, time.Since(begin).Round(time.Millisecond))
	c.agents[i] = c.agentHost(i).Start(t, "agent", nil, c.agentArgv(i)...)
}

// requireRunning fails at once when a daemon has died, rather than letting
// a poll wait out its deadline. Agents a test killed are not expected to run.
func (c *cluster) requireRunning(t *testing.T) {
	t.Helper()
	for i, p := range append([]*netns.Proc{c.controller}, c.agents...) {
		// A replicated cluster's controllers come and go on purpose.
		if (i > 0 && c.killed[i-1]) || p == nil {
			continue
		}
		select {
		case <-p.Exited():
			t.Fatalf("%s on %s exited: %v (log: %s)", p.Name, p.Host.Name, p.Wait(), p.LogPath())
		default:
		}
	}
}

// ctlResult is one rdzvctl run.
type ctlResult struct {
	args           []string
	stdout, stderr string
	err            error
}

// exitCode is rdzvctl's exit status, or -1 if it did not run to an exit.
func (r ctlResult) exitCode() int {
	if r.err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(r.err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

func (r ctlResult) String() string {
	return fmt.Sprintf("rdzvctl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), r.exitCode(), r.stdout, r.stderr)
}

// ctlWith runs rdzvctl on h0 with the operator's certificate and explicit
// global flags, which may name other TLS files.
func (c *cluster) ctlWith(timeout time.Duration, args ...string) ctlResult {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stdout, stderr, err := c.controllerHost().Run(ctx, nil, append([]string{c.ctlBin, "--tls-dir", c.pkiDir}, args...)...)
	return ctlResult{args: args, stdout: stdout, stderr: stderr, err: err}
}

// ctl runs rdzvctl on h0 against the controller.
func (c *cluster) ctl(args ...string) ctlResult {
	return c.ctlWith(commandTimeout, append([]string{"--controller", c.controllerAddr}, args...)...)
}

// ctlOK runs rdzvctl and requires it to succeed.
func (c *cluster) ctlOK(t *testing.T, args ...string) string {
	t.Helper()
	r := c.ctl(args...)
	require.NoError(t, r.err, "%s", r)
	return r.stdout
}

// ctlJSON runs `rdzvctl CMD -o json ARGS...` and decodes its output.
func (c *cluster) ctlJSON(t *testing.T, v any, cmd string, args ...string) {
	t.Helper()
	out := c.ctlOK(t, append([]string{cmd, "-o", "json"}, args...)...)
	require.NoError(t, json.Unmarshal([]byte(out), v), "rdzvctl %s output:\n%s", cmd, out)
}

// nodes lists the registry, or returns an error while the controller is not
// answering yet.
func (c *cluster) nodes() ([]nodeJSON, error) {
	r := c.ctl("nodes", "-o", "json")
	if r.err != nil {
		return nil, fmt.Errorf("%s", r)
	}
	var resp struct {
		Nodes []nodeJSON `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &resp); err != nil {
		return nil, fmt.Errorf("decoding rdzvctl nodes output %q: %w", r.stdout, err)
	}
	return resp.Nodes, nil
}

// waitNodes polls `rdzvctl nodes` until ok accepts the registry, which must
// list exactly the agent hosts.
func (c *cluster) waitNodes(t *testing.T, what string, ok func([]nodeJSON) bool) []nodeJSON {
	t.Helper()
	var (
		last    []nodeJSON
		lastErr error
	)
	deadline := time.Now().Add(readyTimeout)
	for {
		c.requireRunning(t)
		nodes, err := c.nodes()
		if err == nil && len(nodes) == c.hosts && ok(nodes) {
			return nodes
		}
		if err == nil {
			last = nodes
		}
		lastErr = err
		if time.Now().After(deadline) {
			t.Fatalf("nodes never became %s within %s; last registry: %+v; last error: %v", what, readyTimeout, last, lastErr)
		}
		time.Sleep(pollEvery)
	}
}

// waitReady waits until h1..h3 are registered and READY, in name order.
func (c *cluster) waitReady(t *testing.T) []nodeJSON {
	t.Helper()
	return c.waitNodes(t, "READY", func(nodes []nodeJSON) bool {
		for i, n := range nodes {
			if n.Info.Name != c.agentHost(i).Name || n.State != "NODE_STATE_READY" {
				return false
			}
		}
		return true
	})
}

// report logs what an operator would look at, while the daemons still run;
// the netns harness adds the tails of their own logs afterwards. Tests defer
// it, so it runs before any cleanup stops the processes.
func (c *cluster) report() {
	t := c.t
	if !t.Failed() {
		return
	}
	cmds := [][]string{{"nodes"}, {"list"}, {"events"}}
	if c.job != "" {
		cmds = append(cmds, []string{"status", c.job}, []string{"events", c.job})
	}
	for _, args := range cmds {
		t.Logf("e2e: %s", c.ctlWith(10*time.Second, append([]string{"--controller", c.controllerAddr}, args...)...))
	}
	if c.job == "" {
		return
	}
	for i := range c.agents {
		path := filepath.Join(c.stateDir(i), "logs", c.job+".log")
		data, err := os.ReadFile(path)
		if err != nil {
			t.Logf("e2e: %v", err)
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 60 {
			lines = lines[len(lines)-60:]
		}
		t.Logf("e2e: last %d lines of %s:\n%s", len(lines), path, strings.Join(lines, "\n"))
	}
}
