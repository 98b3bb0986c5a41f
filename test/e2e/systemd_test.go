package e2e

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/wire"
)

// systemd cannot run as PID 1 here, so the units' sandboxes are rebuilt
// from their own directives with a mount namespace per daemon (unshare),
// read-only bind remounts and setpriv: what the unit declares is what the
// test runs under, and editing the unit changes the test.

// unit is the [Service] section of a systemd unit: each directive's values
// in order (a directive given twice, or with several space-separated
// paths, has several).
type unit map[string][]string

func readUnit(t *testing.T, name string) unit {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "deploy", "systemd", name))
	require.NoError(t, err)
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, ok := strings.Cut(line, "=")
			require.True(t, ok, "%s: %q is no directive", name, line)
			u[k] = append(u[k], strings.Fields(v)...)
		}
	}
	require.NoError(t, sc.Err())
	return u
}

func (u unit) last(k string) string {
	if v := u[k]; len(v) > 0 {
		return v[len(v)-1]
	}
	return ""
}

// sandbox is what a unit's directives make of the file system and the
// process's privileges.
type sandbox struct {
	u unit
	// stateDir stands for StateDirectory= (/var/lib/<dir>), which the test
	// daemons keep elsewhere.
	stateDir string
	// uid and gid stand for User= and Group= when the unit names a user
	// other than root (which this machine need not have).
	uid, gid int
}

// reproduced are the directives the sandbox rebuilds; the others need
// systemd itself (seccomp, capabilities of PID 1's making, cgroups) and are
// scored by systemd-analyze instead (deploy/systemd's tests).
var reproduced = []string{"ProtectSystem", "ProtectHome", "PrivateTmp", "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths",
	"StateDirectory", "NoNewPrivileges", "User", "Group", "CapabilityBoundingSet", "AmbientCapabilities"}

// script is the shell that sets up the sandbox in a new mount namespace,
// in the order systemd applies it (the whole tree first, then each path
// from the least to the most specific), then execs "$@".
func (s sandbox) script() string {
	var b strings.Builder
	b.WriteString("set -e\nmount --make-rprivate /\n")
	// ro remounts a path read-only, binding it onto itself first when it
	// is no mount point of its own.
	b.WriteString(`ro() { [ -e "$1" ] || return 0; mountpoint -q "$1" || mount --bind "$1" "$1"; mount -o remount,bind,ro "$1"; }
rw() { [ -e "$1" ] || return 0; mount --bind "$1" "$1"; mount -o remount,bind,rw "$1"; }
hide() { [ -e "$1" ] || return 0; mount -t tmpfs -o mode=000 tmpfs "$1"; }
`)
	switch s.u.last("ProtectSystem") {
	case "strict":
		// Everything but the API file systems, each mount on its own.
		b.WriteString(`for m in $(awk '{print $5}' /proc/self/mountinfo | sort -u); do
	case "$m" in /dev|/dev/*|/proc|/proc/*|/sys|/sys/*) continue ;; esac
	mount -o remount,bind,ro "$m"
done
`)
	case "full":
		b.WriteString("ro /usr; ro /boot; ro /efi; ro /etc\n")
	case "yes", "true":
		b.WriteString("ro /usr; ro /boot; ro /efi\n")
	}
	home := []string{"/home", "/root", "/run/user"}
	switch s.u.last("ProtectHome") {
	case "read-only":
		for _, p := range home {
			fmt.Fprintf(&b, "ro %s\n", p)
		}
	case "yes", "true", "tmpfs":
		for _, p := range home {
			fmt.Fprintf(&b, "hide %s\n", p)
		}
	}
	if v := s.u.last("PrivateTmp"); v == "yes" || v == "true" {
		b.WriteString("mount -t tmpfs -o mode=1777 tmpfs /tmp\nmount -t tmpfs -o mode=1777 tmpfs /var/tmp\n")
	}
	type path struct{ p, fn string }
	var paths []path
	for _, k := range []struct{ directive, fn string }{{"ReadOnlyPaths", "ro"}, {"InaccessiblePaths", "hide"}, {"ReadWritePaths", "rw"}} {
		for _, p := range s.u[k.directive] {
			paths = append(paths, path{strings.TrimLeft(p, "-+"), k.fn})
		}
	}
	if len(s.u["StateDirectory"]) > 0 {
		paths = append(paths, path{s.stateDir, "rw"})
	}
	slices.SortStableFunc(paths, func(a, b path) int { return strings.Count(a.p, "/") - strings.Count(b.p, "/") })
	for _, p := range paths {
		fmt.Fprintf(&b, "%s %s\n", p.fn, strconv.Quote(p.p))
	}
	b.WriteString(`exec "$@"` + "\n")
	return b.String()
}

// wrap is the argv prefix that runs a command in the sandbox.
func (s sandbox) wrap() []string {
	argv := []string{"unshare", "--mount", "--propagation", "private", "sh", "-c", s.script(), "sandbox"}
	setpriv := []string{"setpriv"}
	if v := s.u.last("NoNewPrivileges"); v == "yes" || v == "true" {
		setpriv = append(setpriv, "--no-new-privs")
	}
	if user := s.u.last("User"); user != "" && user != "root" {
		setpriv = append(setpriv, "--reuid", strconv.Itoa(s.uid), "--regid", strconv.Itoa(s.gid), "--clear-groups")
	}
	if v, set := s.u["CapabilityBoundingSet"]; set && len(v) == 0 {
		setpriv = append(setpriv, "--bounding-set", "-all", "--inh-caps", "-all")
	}
	if len(setpriv) > 1 {
		argv = append(argv, append(setpriv, "--")...)
	}
	return argv
}

// TestSystemdUnitSandbox runs the controller and the agents in the
// sandboxes their units declare, and in them the example job through real
// torchrun, restarting an agent mid-job as `systemctl restart` would: the
// workers must train on, adopted, to the end.
func TestSystemdUnitSandbox(t *testing.T) {
	agentUnit, controllerUnit := readUnit(t, "rdzv-agent.service"), readUnit(t, "rdzv-controller.service")
	for _, u := range []unit{agentUnit, controllerUnit} {
		require.Equal(t, []string{"notify"}, u["Type"], "both daemons tell systemd when they are ready")
	}
	// The agent hands its workers over on SIGTERM; any other KillMode would
	// have systemd kill them on every agent restart.
	require.Equal(t, []string{"process"}, agentUnit["KillMode"])
	var left []string
	for _, k := range slices.Sorted(maps.Keys(agentUnit)) {
		if !slices.Contains(reproduced, k) && (strings.HasPrefix(k, "Protect") || strings.HasPrefix(k, "Restrict") || strings.HasPrefix(k, "Lock")) {
			left = append(left, k)
		}
	}
	t.Logf("e2e: the agent unit's %s need systemd; systemd-analyze security scores them (deploy/systemd)", strings.Join(left, ", "))

	// Not under /tmp, which is the controller's own under PrivateTmp: the
	// test's files stay where the daemons' units let them see them.
	base, err := os.MkdirTemp("/var/lib", "rdzv-e2e-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	tmpdir, hadTmpdir := os.LookupEnv("TMPDIR")
	t.Setenv("TMPDIR", base)
	c := newCluster(t) // t.TempDir is now under base, and stays there
	if hadTmpdir {
		os.Setenv("TMPDIR", tmpdir)
	} else {
		os.Unsetenv("TMPDIR")
	}
	c.heartbeatTimeout = faultHeartbeatTimeout
	c.agentArgs = []string{"--stop-grace", faultStopGrace}
	// The daemons run from where an install puts them, outside /tmp: a
	// checkout under /tmp is hidden by the controller's PrivateTmp.
	binDir := filepath.Join(base, "bin")
	require.NoError(t, os.Mkdir(binDir, 0o755))
	for _, bin := range []*string{&c.controllerBin, &c.agentBin} {
		data, err := os.ReadFile(*bin)
		require.NoError(t, err)
		*bin = filepath.Join(binDir, filepath.Base(*bin))
		require.NoError(t, os.WriteFile(*bin, data, 0o755))
	}

	// The controller's files belong to its user, as docs/install.md
	// ("Install with systemd") sets them up: the data directory (StateDirectory makes it
	// rdzv's), its certificate and key readable through the group.
	const rdzvUID = 64999 // no such user here: what matters is that it is not root
	require.NoError(t, os.MkdirAll(c.controllerDataDir(), 0o700))
	require.NoError(t, os.Chown(c.controllerDataDir(), rdzvUID, rdzvUID))
	for p, mode := range map[string]os.FileMode{c.pkiDir: 0o750, filepath.Join(c.pkiDir, "controller-rdzv-controller.key"): 0o640} {
		require.NoError(t, os.Chown(p, 0, rdzvUID))
		require.NoError(t, os.Chmod(p, mode))
	}
	// The directories above are the test's (0700): open them to the user.
	for d := c.dir; d != "/var/lib"; d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	c.controllerWrap = sandbox{u: controllerUnit, stateDir: c.controllerDataDir(), uid: rdzvUID, gid: rdzvUID}.wrap()

	// The operator adds each checkpoint.dir to ReadWritePaths (the unit's
	// commented line).
	ckpt := filepath.Join(c.dir, "ckpt")
	require.NoError(t, os.MkdirAll(ckpt, 0o755))
	c.agentWrap = func(i int) []string {
		return sandbox{u: withPaths(agentUnit, "ReadWritePaths", ckpt), stateDir: c.stateDir(i)}.wrap()
	}
	for i := range agentHosts {
		require.NoError(t, os.MkdirAll(c.stateDir(i), 0o755))
	}

	c.startEmbeddedController()
	c.startAgents()
	t.Cleanup(c.report)
	c.waitReady(t)

	t.Run("the sandbox is the unit's", func(t *testing.T) {
		// From inside an agent's sandbox: the system is read-only, /tmp and
		// the state directory are writable.
		probe := func(box sandbox, path string) error {
			cmd := exec.Command(box.wrap()[0], append(box.wrap()[1:], "touch", path)...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			return os.Remove(path)
		}
		box := sandbox{u: agentUnit, stateDir: c.stateDir(0)}
		system, err := os.MkdirTemp("/var/lib", "rdzv-e2e-probe-")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(system) })
		require.Error(t, probe(box, filepath.Join(system, "x")), "ProtectSystem=strict: /var/lib is read-only")
		require.NoError(t, probe(box, filepath.Join(c.stateDir(0), "x")), "StateDirectory is writable")
		tmp, err := os.MkdirTemp("/tmp", "rdzv-e2e-probe-")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(tmp) })
		require.NoError(t, probe(box, filepath.Join(tmp, "x")), "workers write to /tmp (torchrun, --log_dir)")
		// The same probe in the sandbox the unit had before: /tmp read-only.
		old := unit{}
		for k, v := range agentUnit {
			old[k] = v
		}
		old["ReadWritePaths"] = nil
		require.Error(t, probe(sandbox{u: old, stateDir: c.stateDir(0)}, filepath.Join(tmp, "x")), "without ReadWritePaths=/tmp")
	})

	t.Run("a checkpoint.dir the sandbox keeps read-only fails the job at once", func(t *testing.T) {
		// Left out of ReadWritePaths: read-only to the agent and its
		// workers under ProtectSystem=strict, though root may write it
		// outside the sandbox.
		unlisted := filepath.Join(c.dir, "ckpt-unlisted")
		require.NoError(t, os.MkdirAll(unlisted, 0o777))
		job := faultJob(t, c, "systemd-unlisted-ckpt", func(spec map[string]any) {
			spec["checkpoint"] = map[string]any{"dir": unlisted}
		})
		j := c.waitJob(t, job.Name, "failed", func(j jobJSON) bool { return finished(j.State) })
		require.Equal(t, "JOB_STATE_FAILED", j.State, "reason: %s", j.Reason)
		require.Contains(t, j.Reason, wire.FailureCheckpointDirNotWritable+": node ")
		require.Contains(t, j.Reason, "checkpoint.dir "+unlisted+" is read-only on node ")
		require.Contains(t, j.Reason, "(EROFS: ")
		require.Contains(t, j.Reason, "ReadWritePaths="+unlisted)
		require.Zero(t, j.Restarts, "not restarted into the same failure")
	})

	// faultJob's job, with the example's own --log_dir under /tmp (a fresh
	// one: torchrun refuses a directory that is not empty).
	logDir, err := os.MkdirTemp("/tmp", "rdzv-torchrun-logs-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(logDir) })
	job := faultJob(t, c, "systemd-sandbox", func(spec map[string]any) {
		spec["checkpoint"] = map[string]any{"dir": ckpt}
		launcher := spec["launcher"].(map[string]any)
		extra := launcher["extra_args"].([]any)
		extra[slices.Index(extra, any("--log_dir"))+1] = logDir
	})
	c.waitCheckpoint(t, job.Name, checkpointEvery)
	workers := trainingPids(t, c, 1)
	require.NotEmpty(t, workers)
	for _, pid := range workers {
		mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		require.NoError(t, err)
		require.Regexp(t, `(?m)^\S+ \S+ \S+ / / ro[, ]`, string(mounts), "worker %d does not run in the unit's sandbox", pid)
	}

	c.restartAgent(t, 1)
	for _, pid := range workers {
		require.NotEmpty(t, procStatus(pid, "State"), "training process %d did not survive the agent restart", pid)
	}
	j := c.waitJob(t, job.Name, "finished", func(j jobJSON) bool { return finished(j.State) })
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, "reason: %s", j.Reason)
	require.Zero(t, j.Restarts, "the agent restart did not fail the job")
	require.DirExists(t, filepath.Join(ckpt, fmt.Sprintf("step-%d", faultSteps)))
	c.requireWorkersGone(t, job.Name, nil)
}

// withPaths is u with paths added to directive.
func withPaths(u unit, directive string, paths ...string) unit {
	out := unit{}
	for k, v := range u {
		out[k] = slices.Clone(v)
	}
	out[directive] = append(out[directive], paths...)
	return out
}
