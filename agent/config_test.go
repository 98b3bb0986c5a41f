package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/health"
	"github.com/rdzv/rdzv/pki"
)

func TestConfigValidate(t *testing.T) {
	valid := func() Config {
		c := DefaultConfig()
		c.Controller = "controller.example:7070"
		c.TLS = pki.Files{Cert: "/etc/rdzv/pki/agent.crt", Key: "/etc/rdzv/pki/agent.key", CA: "/etc/rdzv/pki/ca.crt"}
		return c
	}
	tests := []struct {
		name string
		edit func(*Config)
		// wantFields are the fields the error must name; none means valid.
		wantFields []string
	}{
		{name: "defaults with a controller", edit: func(*Config) {}},
		{name: "everything set", edit: func(c *Config) {
			c.NodeName, c.Labels, c.NCCLInterface, c.FakeGPUs = "gpu-01", map[string]string{"pool": "train"}, "ib0", 8
		}},
		{name: "no controller", edit: func(c *Config) { c.Controller = "" }, wantFields: []string{"controller"}},
		{name: "controller without port", edit: func(c *Config) { c.Controller = "controller.example" }, wantFields: []string{"controller"}},
		{name: "controller replicas", edit: func(c *Config) { c.Controller = "10.0.0.1:7070, 10.0.0.2:7070" }},
		{name: "one replica without port", edit: func(c *Config) { c.Controller = "10.0.0.1:7070,10.0.0.2" }, wantFields: []string{"controller"}},
		{name: "relays", edit: func(c *Config) { c.Relays = "10.0.12.1:7071, 10.0.12.2:7071" }},
		{name: "relay without port", edit: func(c *Config) { c.Relays = "10.0.12.1" }, wantFields: []string{"relays"}},
		{name: "never back to the relay", edit: func(c *Config) { c.RelayReturn.Duration = 0 }},
		{name: "back to the relay too often", edit: func(c *Config) { c.RelayReturn.Duration = 5 * time.Second }, wantFields: []string{"relay_return"}},
		{name: "negative relay return", edit: func(c *Config) { c.RelayReturn.Duration = -time.Minute }, wantFields: []string{"relay_return"}},
		{name: "relays for an insecure agent", edit: func(c *Config) { c.Relays, c.Insecure, c.TLS = "10.0.12.1:7071", true, pki.Files{} }, wantFields: []string{"relays"}},
		{name: "bad node name", edit: func(c *Config) { c.NodeName = "GPU_01" }, wantFields: []string{"node_name"}},
		{name: "bad label key", edit: func(c *Config) { c.Labels = map[string]string{"-pool": "x"} }, wantFields: []string{"labels"}},
		{name: "bad label value", edit: func(c *Config) { c.Labels = map[string]string{"pool": "a b"} }, wantFields: []string{"labels.pool"}},
		{name: "negative fake gpus", edit: func(c *Config) { c.FakeGPUs = -1 }, wantFields: []string{"fake_gpus"}},
		{name: "too many fake gpus", edit: func(c *Config) { c.FakeGPUs = 65 }, wantFields: []string{"fake_gpus"}},
		{name: "relative state dir", edit: func(c *Config) { c.StateDir = "var/lib/rdzv" }, wantFields: []string{"state_dir"}},
		{name: "no state dir", edit: func(c *Config) { c.StateDir = "" }, wantFields: []string{"state_dir"}},
		{name: "no tls files", edit: func(c *Config) { c.TLS = pki.Files{} }, wantFields: []string{"tls.cert", "tls.key", "tls.ca"}},
		{name: "no key file", edit: func(c *Config) { c.TLS.Key = "" }, wantFields: []string{"tls.key"}},
		{name: "insecure needs no tls files", edit: func(c *Config) { c.TLS, c.Insecure = pki.Files{}, true }},
		{name: "zero stop grace", edit: func(c *Config) { c.StopGrace.Duration = 0 }, wantFields: []string{"stop_grace"}},
		{name: "metrics off", edit: func(c *Config) { c.HTTP.Listen = "" }},
		{name: "metrics address without port", edit: func(c *Config) { c.HTTP.Listen = "localhost" }, wantFields: []string{"http.listen"}},
		{name: "metrics key without certificate", edit: func(c *Config) { c.HTTP.KeyFile = "/etc/rdzv/pki/m.key" }, wantFields: []string{"http.key_file"}},
		{name: "relative secrets dir", edit: func(c *Config) { c.SecretsDir = "secrets" }, wantFields: []string{"secrets_dir"}},
		{name: "unclean secrets dir", edit: func(c *Config) { c.SecretsDir = "/etc/rdzv/../secrets" }, wantFields: []string{"secrets_dir"}},
		{name: "empty run_as: dynamic users", edit: func(c *Config) { c.RunAs = "" }},
		{name: "dynamic users from root", edit: func(c *Config) { c.DynamicUsers.First = 0 }, wantFields: []string{"dynamic_users.first"}},
		{name: "dynamic users backwards", edit: func(c *Config) { c.DynamicUsers = DynamicUsers{First: 61184, Last: 61183} }, wantFields: []string{"dynamic_users.last"}},
		{name: "dynamic users up to the invalid uid", edit: func(c *Config) { c.DynamicUsers.Last = 4294967295 }, wantFields: []string{"dynamic_users.last"}},
		{name: "too many dynamic users", edit: func(c *Config) { c.DynamicUsers = DynamicUsers{First: 100000, Last: 200000} }, wantFields: []string{"dynamic_users"}},
		{name: "named run_as needs no dynamic users", edit: func(c *Config) { c.RunAs, c.DynamicUsers = "nobody", DynamicUsers{} }},
		{name: "bad run_as", edit: func(c *Config) { c.RunAs = "no body" }, wantFields: []string{"run_as"}},
		{name: "bad run_as_policy entries", edit: func(c *Config) {
			c.RunAsPolicy.AllowedUsers = []string{"alice", "a b"}
			c.RunAsPolicy.PrivilegedGroups = []string{"docker", "5-1"}
		}, wantFields: []string{"run_as_policy.allowed_users[1]", "run_as_policy.privileged_groups[1]"}},
		{name: "relative worker_path entry", edit: func(c *Config) { c.WorkerPath = "/usr/bin:bin" }, wantFields: []string{"worker_path"}},
		{name: "empty worker_path entry", edit: func(c *Config) { c.WorkerPath = "/usr/bin::/bin" }, wantFields: []string{"worker_path"}},
		{name: "no worker_path", edit: func(c *Config) { c.WorkerPath = "" }, wantFields: []string{"worker_path"}},
		{name: "ignored and critical xids", edit: func(c *Config) {
			c.GPUHealth = health.GPUConfig{IgnoredXIDs: []health.XIDEntry{"all", "48"}, CriticalXIDs: []health.XIDEntry{"79"}}
		}},
		{name: "bad xids", edit: func(c *Config) {
			c.GPUHealth = health.GPUConfig{IgnoredXIDs: []health.XIDEntry{"xid48"}, CriticalXIDs: []health.XIDEntry{"all"}}
		}, wantFields: []string{"gpu_health.ignored_xids[0]", "gpu_health.critical_xids[0]"}},
		{name: "every problem at once", edit: func(c *Config) {
			c.Controller, c.NodeName, c.FakeGPUs, c.StateDir, c.StopGrace.Duration = "", "X", -1, "rel", -time.Second
		}, wantFields: []string{"controller", "node_name", "fake_gpus", "state_dir", "stop_grace"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.edit(&c)
			err := c.Validate()
			if len(tt.wantFields) == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, f := range tt.wantFields {
				require.Contains(t, err.Error(), f+":")
			}
			require.Len(t, strings.Split(err.Error(), "\n"), len(tt.wantFields), "one line per problem: %v", err)
		})
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
		return p
	}

	cfg, _, err := LoadConfig(write("agent.yaml", "controller: 10.0.0.1:7070\nnode_name: gpu-01\nstop_grace: 30s\nlabels: {pool: train}\n"+
		"tls: {cert: /etc/rdzv/pki/agent.crt, key: /etc/rdzv/pki/agent.key, ca: /etc/rdzv/pki/ca.crt}\n"))
	require.NoError(t, err)
	require.NoError(t, cfg.Validate())
	require.Equal(t, pki.Files{Cert: "/etc/rdzv/pki/agent.crt", Key: "/etc/rdzv/pki/agent.key", CA: "/etc/rdzv/pki/ca.crt"}, cfg.TLS)
	require.Equal(t, "10.0.0.1:7070", cfg.Controller)
	require.Equal(t, 30*time.Second, cfg.StopGrace.Duration)
	require.Equal(t, map[string]string{"pool": "train"}, cfg.Labels)
	require.Equal(t, DefaultConfig().StateDir, cfg.StateDir, "unset fields keep their defaults")

	cfg, _, err = LoadConfig(write("xids.yaml", "gpu_health: {ignored_xids: [48, all], critical_xids: [\"79\"]}\n"))
	require.NoError(t, err)
	require.Equal(t, health.GPUConfig{IgnoredXIDs: []health.XIDEntry{"48", "all"}, CriticalXIDs: []health.XIDEntry{"79"}}, cfg.GPUHealth)

	cfg, _, err = LoadConfig(write("runas.yaml", "run_as_policy: {allowed_users: [alice, 2000-2999], privileged_groups: [docker]}\nworker_path: /opt/conda/bin:/usr/bin:/bin\n"))
	require.NoError(t, err)
	require.Equal(t, RunAsPolicy{AllowedUsers: []string{"alice", "2000-2999"}, PrivilegedGroups: []string{"docker"}}, cfg.RunAsPolicy,
		"a list given replaces the default one; one not given keeps it")
	require.Equal(t, "/opt/conda/bin:/usr/bin:/bin", cfg.WorkerPath)
	cfg, _, err = LoadConfig(write("groups.yaml", "run_as_policy: {allowed_groups: [ml]}\n"))
	require.NoError(t, err)
	require.Equal(t, DefaultRunAsPolicy().PrivilegedGroups, cfg.RunAsPolicy.PrivilegedGroups)

	_, _, err = LoadConfig(write("typo.yaml", "controler: 10.0.0.1:7070\n"))
	require.ErrorContains(t, err, "controler", "an unknown field is an error, not a silent default")
	_, _, err = LoadConfig(write("baddur.yaml", "stop_grace: soon\n"))
	require.ErrorContains(t, err, "soon")
	_, _, err = LoadConfig(filepath.Join(dir, "missing.yaml"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestShippedConfig keeps deploy/config/agent.yaml loadable: secure, with
// its TLS files set.
func TestShippedConfig(t *testing.T) {
	cfg, _, err := LoadConfig(filepath.Join("..", "deploy", "config", "agent.yaml"))
	require.NoError(t, err)
	require.NoError(t, cfg.Validate())
	require.False(t, cfg.Insecure)
	require.Equal(t, "/etc/rdzv/pki/agent.crt", cfg.TLS.Cert)
	require.Equal(t, DefaultHTTPListen, cfg.HTTP.Listen, "the file says the default metrics address")
}

// TestShippedConfigDefaults keeps the run_as policy and worker PATH written
// out in deploy/config/agent.yaml the same as the defaults.
func TestShippedConfigDefaults(t *testing.T) {
	cfg, _, err := LoadConfig(filepath.Join("..", "deploy", "config", "agent.yaml"))
	require.NoError(t, err)
	def := DefaultRunAsPolicy()
	require.Equal(t, def.AllowedUsers, cfg.RunAsPolicy.AllowedUsers)
	require.Empty(t, cfg.RunAsPolicy.AllowedGroups)
	require.ElementsMatch(t, def.PrivilegedGroups, cfg.RunAsPolicy.PrivilegedGroups)
	require.Equal(t, DefaultWorkerPath, cfg.WorkerPath)
	require.Empty(t, cfg.RunAs, "jobs without run_as get dynamic users")
	require.Equal(t, DefaultDynamicUsers(), cfg.DynamicUsers)
	hc := cfg.HealthChecks
	require.Empty(t, hc.Storage.Paths)
	require.Empty(t, hc.Commands)
	hc.Storage.Paths, hc.Commands = nil, nil
	require.Equal(t, DefaultHealthChecks(), hc, "health_checks as written out")
}
