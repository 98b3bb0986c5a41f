package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func requireRootAndNobody(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("switching workers to another user needs a root agent")
	}
	if _, err := user.Lookup("nobody"); err != nil {
		t.Skip("no user nobody on this machine")
	}
}

func TestResolveRunAs(t *testing.T) {
	requireRootAndNobody(t)
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{65534}}
	tests := []struct {
		name      string
		job       string
		agent     string
		allowRoot bool
		want      *syscall.Credential
		wantHome  string
		wantErr   string
	}{
		{name: "agent default", agent: "nobody", want: nobody, wantHome: "/nonexistent"},
		{name: "job overrides", job: "nobody", agent: "root", want: nobody},
		{name: "uid", agent: "65534", want: nobody},
		{name: "uid and gid exactly", agent: "4242:4343", want: &syscall.Credential{Uid: 4242, Gid: 4343, Groups: []uint32{4343}}},
		{name: "unknown uid without gid", agent: "4242", wantErr: "uid 4242 has no user entry on this node, so give its group too"},
		{name: "unknown user", job: "no-such-user-rdzv", agent: "nobody", wantErr: `run_as "no-such-user-rdzv"`},
		{name: "root refused", job: "root", agent: "nobody", wantErr: "not allowed by this agent"},
		{name: "uid 0 refused", agent: "0", wantErr: "not allowed by this agent"},
		{name: "gid 0 refused", agent: "65534:0", wantErr: "not allowed by this agent"},
		// Root is this test's own user: allowed, nothing to switch.
		{name: "root allowed", agent: "root", allowRoot: true, want: nil, wantHome: "/root"},
		{name: "invalid", job: "a b", agent: "nobody", wantErr: "run_as: must be a user name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ResolveRunAs(tt.job, tt.agent, tt.allowRoot, DefaultRunAsPolicy())
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, r.Credential)
			if tt.wantHome != "" {
				require.Equal(t, tt.wantHome, r.Env["HOME"])
			}
		})
	}
	_, err := ResolveRunAs("root", "nobody", false, DefaultRunAsPolicy())
	require.True(t, errors.Is(err, errRootRefused))
}

// TestRunAsPolicyOnThisNode resolves users and groups from this node's
// user database (Debian's numbering) through the default policy and edits
// of it: each refusal names the user or group, the rule and how to allow it.
func TestRunAsPolicyOnThisNode(t *testing.T) {
	requireRootAndNobody(t)
	for _, g := range []string{"shadow", "disk", "video"} {
		if _, err := user.LookupGroup(g); err != nil {
			t.Skipf("no group %s on this machine", g)
		}
	}
	gid := func(name string) string {
		g, err := user.LookupGroup(name)
		require.NoError(t, err)
		return g.Gid
	}
	daemon, err := user.Lookup("daemon")
	require.NoError(t, err)
	tests := []struct {
		name   string
		job    string
		edit   func(*RunAsPolicy)
		rule   string
		want   string
		wantOK bool
	}{
		{name: "nobody", job: "nobody", wantOK: true},
		{name: "regular uid", job: "4242:4343", wantOK: true},
		{name: "nobody with video for GPUs", job: "65534:" + gid("video"), wantOK: true},
		{name: "group shadow", job: "65534:" + gid("shadow"), rule: "privileged_groups",
			want: `run_as "65534:` + gid("shadow") + `": has primary group ` + gid("shadow") + ` (shadow), which matches "shadow" in this agent's run_as_policy.privileged_groups; to allow it, remove "shadow" from that list`},
		{name: "group disk", job: "65534:" + gid("disk"), rule: "privileged_groups", want: `(disk), which matches "disk"`},
		{name: "privileged gid range", job: "4242:4343", edit: func(p *RunAsPolicy) { p.PrivilegedGroups = []string{"4000-4999"} },
			rule: "privileged_groups", want: `has primary group 4343, which matches "4000-4999"`},
		{name: "system user", job: "daemon", rule: "allowed_users",
			want: `run_as "daemon": is uid ` + daemon.Uid + ` (daemon), which matches no entry of this agent's run_as_policy.allowed_users ["nobody" "1000-4294967294"]; to allow it, add "daemon" or ` + daemon.Uid + ` there`},
		{name: "system uid", job: daemon.Uid + ":4343", rule: "allowed_users", want: `is uid ` + daemon.Uid + ` (daemon)`},
		{name: "system user allowed by name", job: "daemon", edit: func(p *RunAsPolicy) { p.AllowedUsers = append(p.AllowedUsers, "daemon") }, wantOK: true},
		{name: "outside allowed_groups", job: "65534:" + gid("video"), edit: func(p *RunAsPolicy) { p.AllowedGroups = []string{"nogroup", "5000-5999"} },
			rule: "allowed_groups", want: `has primary group ` + gid("video") + ` (video), which matches no entry of this agent's run_as_policy.allowed_groups ["nogroup" "5000-5999"]; to allow it, add "video" or ` + gid("video") + ` there`},
		{name: "inside allowed_groups", job: "nobody", edit: func(p *RunAsPolicy) { p.AllowedGroups = []string{"nogroup"} }, wantOK: true},
		{name: "privileged group allowed by removing it", job: "65534:" + gid("shadow"), edit: func(p *RunAsPolicy) { p.PrivilegedGroups = nil }, wantOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			policy := DefaultRunAsPolicy()
			if tt.edit != nil {
				tt.edit(&policy)
			}
			_, err := ResolveRunAs(tt.job, "nobody", false, policy)
			if tt.wantOK {
				require.NoError(t, err)
				return
			}
			var refusal *RunAsRefusal
			require.ErrorAs(t, err, &refusal)
			require.Equal(t, tt.rule, refusal.Rule)
			require.ErrorContains(t, err, tt.want)
		})
	}

	// A user this node puts in a privileged group (Debian's postgres is in
	// ssl-cert) is refused for that supplementary group even once its uid
	// is allowed.
	if u, err := user.Lookup("postgres"); err == nil {
		if ids, err := u.GroupIds(); err == nil && slices.Contains(ids, gid("ssl-cert")) {
			policy := DefaultRunAsPolicy()
			policy.AllowedUsers = append(policy.AllowedUsers, "postgres")
			_, err := ResolveRunAs("postgres", "nobody", false, policy)
			var refusal *RunAsRefusal
			require.ErrorAs(t, err, &refusal)
			require.Equal(t, "privileged_groups", refusal.Rule)
			require.ErrorContains(t, err, `has supplementary group `+gid("ssl-cert")+` (ssl-cert), which matches "ssl-cert"`)
		}
	}
}

// TestRunAsPolicyGroups applies the policy to given groups, as a user in
// the node's database would hold them: supplementary groups count as much
// as the primary one, and group 0 is allow_root's.
func TestRunAsPolicyGroups(t *testing.T) {
	names := map[uint32]string{0: "root", 6: "disk", 27: "sudo", 44: "video", 1000: "alice", 2000: "ml"}
	name := func(g uint32) string { return names[g] }
	tests := []struct {
		name      string
		gid       uint32
		groups    []uint32
		allowRoot bool
		edit      func(*RunAsPolicy)
		want      string
		wantRoot  bool
	}{
		{name: "regular groups", gid: 1000, groups: []uint32{1000, 44, 2000}},
		{name: "supplementary disk", gid: 1000, groups: []uint32{1000, 44, 6}, want: `run_as "alice": has supplementary group 6 (disk), which matches "disk" in this agent's run_as_policy.privileged_groups`},
		{name: "supplementary sudo", gid: 1000, groups: []uint32{27}, want: `has supplementary group 27 (sudo)`},
		{name: "supplementary root", gid: 1000, groups: []uint32{0}, wantRoot: true},
		{name: "supplementary root allowed", gid: 1000, groups: []uint32{0}, allowRoot: true},
		{name: "primary root", gid: 0, wantRoot: true},
		{name: "allowed_groups checks supplementary too", gid: 1000, groups: []uint32{2000}, edit: func(p *RunAsPolicy) { p.AllowedGroups = []string{"alice"} },
			want: `has supplementary group 2000 (ml), which matches no entry of this agent's run_as_policy.allowed_groups ["alice"]; to allow it, add "ml" or 2000 there`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			policy := DefaultRunAsPolicy()
			if tt.edit != nil {
				tt.edit(&policy)
			}
			err := policy.check("run_as", "alice", 1000, "alice", tt.gid, tt.groups, tt.allowRoot, name)
			switch {
			case tt.wantRoot:
				require.ErrorIs(t, err, errRootRefused)
			case tt.want != "":
				var refusal *RunAsRefusal
				require.ErrorAs(t, err, &refusal)
				require.ErrorContains(t, err, tt.want)
			default:
				require.NoError(t, err)
			}
		})
	}
}

func TestRunAsPolicyValidate(t *testing.T) {
	require.NoError(t, DefaultRunAsPolicy().Validate("run_as_policy"))
	p := RunAsPolicy{
		AllowedUsers:     []string{"alice", "1000", "1000-2000", "2000-1000", "a b"},
		AllowedGroups:    []string{"", "1-4294967295", "1000:1000"},
		PrivilegedGroups: []string{"x-"},
	}
	err := p.Validate("run_as_policy")
	for _, want := range []string{
		`run_as_policy.allowed_users[3]: "2000-1000": an id range must be lo-hi with lo <= hi < 4294967295`,
		`run_as_policy.allowed_users[4]: "a b": must be a user or group name, an id, or a range of ids lo-hi`,
		`run_as_policy.allowed_groups[0]: ""`,
		`run_as_policy.allowed_groups[1]: "1-4294967295"`,
		`run_as_policy.allowed_groups[2]: "1000:1000": must be a user or group name`,
	} {
		require.ErrorContains(t, err, want)
	}
	require.NotContains(t, err.Error(), "allowed_users[0]")
	require.NotContains(t, err.Error(), "allowed_users[1]")
	require.NotContains(t, err.Error(), "allowed_users[2]")
	// "x-" is a name: names may hold '-'.
	require.NotContains(t, err.Error(), "privileged_groups")
}

// TestWorkersRunConfined runs a real worker as the default user, a dynamic
// user of the job's own: it can write in its workdir and checkpoint
// directory, not in the agent's log directory or
// /etc; it gets its secrets, which appear in no agent log line.
func TestWorkersRunConfined(t *testing.T) {
	requireRootAndNobody(t)
	base, err := os.MkdirTemp("", "rdzv-runas-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	require.NoError(t, os.Chmod(base, 0o755))
	stateDir, ckpt, secrets := filepath.Join(base, "state"), filepath.Join(base, "ckpt"), filepath.Join(base, "secrets")
	for _, d := range []string{stateDir, ckpt} {
		require.NoError(t, os.Mkdir(d, 0o755))
	}
	// The operator lets jobs' dynamic users write in the checkpoint
	// directory (sticky, as /tmp); secrets stay root's, read by the agent
	// for the worker.
	require.NoError(t, os.Chmod(ckpt, 0o777|os.ModeSticky))
	require.NoError(t, os.Mkdir(secrets, 0o700))
	const secret, fileSecret = "s3cret-from-job", "s3cret-from-file"
	require.NoError(t, os.WriteFile(filepath.Join(secrets, "token"), []byte(fileSecret+"\n"), 0o600))
	torchrun := filepath.Join(base, "torchrun")
	require.NoError(t, os.WriteFile(torchrun, []byte(`#!/bin/sh
shift 10
echo "uid=$(id -u) gid=$(id -g) home=$HOME"
try() { if (echo x >"$1") 2>/dev/null; then echo "wrote $1"; else echo "denied $1"; fi; }
try "$PWD/out"
try "$RDZV_CHECKPOINT_DIR/out"
try "$2/evil.log"
try /etc/rdzv-evil
try "$2/../jobs-evil"
printf %s "$JOB_SECRET" >"$PWD/secret"
printf %s "$JOB_FILE" >"$PWD/file-secret"
`), 0o755))

	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
	cfg := DefaultConfig()
	cfg.Controller, cfg.StateDir, cfg.SecretsDir = "127.0.0.1:7070", stateDir, secrets
	require.Empty(t, cfg.RunAs, "workers run as dynamic users unless configured otherwise")
	sup := NewSupervisor(cfg, "node-a", "lo", "127.0.0.1:1", ExecSpawner{}, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	logsDir := filepath.Join(stateDir, "logs")
	sup.Assign(&rdzvv1.Assignment{
		Spec: &rdzvv1.JobSpec{
			Name: "confined", NodesMin: 1, NodesMax: 1, ProcsPerNode: 1, Command: []string{"probe.py", logsDir},
			LauncherTorchrun: torchrun, CheckpointDir: ckpt,
			SecretEnv: map[string]string{"JOB_SECRET": secret},
			EnvFiles:  map[string]string{"JOB_FILE": filepath.Join(secrets, "token")},
		},
		Generation: 1, Nnodes: 1, ProcsPerNode: 1, MasterAddr: "127.0.0.1", MasterPort: 29500,
	})
	var final *rdzvv1.WorkerStatus
	for final == nil || final.GetState() == wRunning {
		select {
		case final = <-sup.Updates():
		case <-time.After(10 * time.Second):
			require.FailNow(t, "no worker status")
		}
	}
	require.Equal(t, wSucceeded, final.GetState(), "%v", final)

	workdir := filepath.Join(stateDir, "jobs", "confined")
	out, err := os.ReadFile(filepath.Join(logsDir, "confined.log"))
	require.NoError(t, err)
	uid := regexp.MustCompile(`(?m)^uid=(\d+) gid=(\d+) home=(.*)$`).FindStringSubmatch(string(out))
	require.NotNil(t, uid, "%s", out)
	n, err := strconv.ParseUint(uid[1], 10, 32)
	require.NoError(t, err)
	require.True(t, cfg.DynamicUsers.contains(uint32(n)), "uid %d is a dynamic user's", n)
	require.Equal(t, uid[1], uid[2], "its group is its own")
	require.Equal(t, workdir, uid[3], "its HOME is the scratch workdir")
	for _, want := range []string{
		"wrote " + workdir + "/out",
		"wrote " + ckpt + "/out",
		"denied " + logsDir + "/evil.log",
		"denied /etc/rdzv-evil",
		"denied " + logsDir + "/../jobs-evil",
	} {
		require.Contains(t, string(out), want+"\n")
	}
	require.NoFileExists(t, "/etc/rdzv-evil")
	require.NotContains(t, string(out), secret)

	got, err := os.ReadFile(filepath.Join(workdir, "secret"))
	require.NoError(t, err)
	require.Equal(t, secret, string(got), "the worker gets secret_env")
	got, err = os.ReadFile(filepath.Join(workdir, "file-secret"))
	require.NoError(t, err)
	require.Equal(t, fileSecret, string(got), "the worker gets env_files, without the trailing newline")

	require.NotZero(t, logs.Len())
	for _, e := range logs.All() {
		line := fmt.Sprint(e.Message, e.ContextMap())
		require.NotContains(t, line, secret)
		require.NotContains(t, line, fileSecret)
	}
}

func TestRootWorkersRefusedByDefault(t *testing.T) {
	h := newSupervisor(t)
	h.sup.runAs, h.sup.allowRoot = "root", false
	h.sup.Assign(h.assignment("train", 1, "ok"))
	st := h.expect("train", 1, wFailed)
	require.Contains(t, st.GetMessage(), `the agent's run_as "root" is uid 0 gid 0: running workers as root is not allowed`)
}

func TestEnvFilesStayInSecretsDir(t *testing.T) {
	base := t.TempDir()
	secrets := filepath.Join(base, "secrets")
	require.NoError(t, os.Mkdir(secrets, 0o700))
	write := func(path, content string) string {
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}
	good := write(filepath.Join(secrets, "good"), "value\r\n")
	outside := write(filepath.Join(base, "outside"), "nope")
	require.NoError(t, os.Symlink(outside, filepath.Join(secrets, "link-out")))
	big := write(filepath.Join(secrets, "big"), strings.Repeat("x", 32<<10+1))
	nul := write(filepath.Join(secrets, "nul"), "a\x00b")

	sup := &Supervisor{secretsDir: secrets}
	tests := []struct {
		name, path, want, wantErr string
	}{
		{"inside", good, "value", ""},
		{"outside", outside, "", "outside the agent's secrets_dir"},
		{"symlink leading out", filepath.Join(secrets, "link-out"), "", "outside the agent's secrets_dir"},
		{"the directory itself", secrets, "", "outside the agent's secrets_dir"},
		{"missing", filepath.Join(secrets, "missing"), "", "no such file"},
		{"too big", big, "", "at most 32768 bytes"},
		{"nul", nul, "", "without NUL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, err := sup.jobEnv(&rdzvv1.JobSpec{Env: map[string]string{"PLAIN": "p"}, EnvFiles: map[string]string{"TOKEN": tt.path}})
			if tt.wantErr != "" {
				require.ErrorContains(t, err, "env_files.TOKEN: ")
				require.ErrorContains(t, err, tt.wantErr)
				require.NotContains(t, err.Error(), "nope")
				return
			}
			require.NoError(t, err)
			require.Equal(t, map[string]string{"PLAIN": "p", "TOKEN": tt.want}, env)
		})
	}
}
