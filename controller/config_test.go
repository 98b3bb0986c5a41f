package controller_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/pki"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*controller.Config)
		// wantFields are the fields the error must name; none means valid.
		wantFields []string
	}{
		{name: "defaults", edit: func(*controller.Config) {}},
		{name: "external etcd needs no data dir, given a secrets key file", edit: func(c *controller.Config) {
			c.Etcd.Endpoints, c.DataDir, c.SecretsKeyFile = []string{"https://etcd-0:2379"}, "", "/etc/rdzv/secrets.key"
			c.AdvertiseAddr = "10.0.0.1:7070"
		}},
		{name: "external etcd without data dir or secrets key file", edit: func(c *controller.Config) {
			c.Etcd.Endpoints, c.DataDir = []string{"https://etcd-0:2379"}, ""
			c.AdvertiseAddr = "10.0.0.1:7070"
		}, wantFields: []string{"secrets_key_file"}},
		{name: "replicas on a wildcard listen address need advertise_addr", edit: func(c *controller.Config) {
			c.Etcd.Endpoints = []string{"https://etcd-0:2379"}
		}, wantFields: []string{"advertise_addr"}},
		{name: "a specific listen address is advertised as is", edit: func(c *controller.Config) {
			c.Etcd.Endpoints, c.Listen = []string{"https://etcd-0:2379"}, "10.0.0.1:7070"
		}},
		{name: "advertise_addr must be dialable", edit: func(c *controller.Config) { c.AdvertiseAddr = "0.0.0.0:7070" },
			wantFields: []string{"advertise_addr"}},
		{name: "short leader lease", edit: func(c *controller.Config) { c.LeaderLeaseTTL.Duration = time.Second },
			wantFields: []string{"leader_lease_ttl"}},
		{name: "vouched timeout under the heartbeat timeout", edit: func(c *controller.Config) { c.Heartbeat.VouchedTimeout.Duration = time.Second },
			wantFields: []string{"heartbeat.vouched_timeout"}},
		{name: "etcd client cert without key", edit: func(c *controller.Config) {
			c.Etcd.Endpoints, c.AdvertiseAddr, c.Etcd.CertFile = []string{"https://etcd-0:2379"}, "10.0.0.1:7070", "/etc/rdzv/etcd.crt"
		}, wantFields: []string{"etcd.cert_file, etcd.key_file"}},
		{name: "etcd client tls with embedded etcd", edit: func(c *controller.Config) { c.Etcd.CAFile = "/etc/rdzv/ca.crt" },
			wantFields: []string{"etcd.ca_file, etcd.cert_file"}},
		{name: "zero request timeout", edit: func(c *controller.Config) { c.Etcd.RequestTimeout.Duration = 0 },
			wantFields: []string{"etcd.request_timeout"}},
		{name: "compaction off", edit: func(c *controller.Config) { c.Etcd.CompactionInterval.Duration = 0 }},
		{name: "negative compaction interval", edit: func(c *controller.Config) { c.Etcd.CompactionInterval.Duration = -time.Second },
			wantFields: []string{"etcd.compaction_interval"}},
		{name: "external etcd with a raised transaction limit", edit: func(c *controller.Config) {
			c.Etcd.Endpoints, c.AdvertiseAddr, c.Etcd.MaxTxnOps = []string{"https://etcd-0:2379"}, "10.0.0.1:7070", 1024
		}},
		{name: "transaction limit below what one change needs", edit: func(c *controller.Config) {
			c.Etcd.Endpoints, c.AdvertiseAddr, c.Etcd.MaxTxnOps = []string{"https://etcd-0:2379"}, "10.0.0.1:7070", 8
		}, wantFields: []string{"etcd.max_txn_ops"}},
		{name: "transaction limit unset", edit: func(c *controller.Config) { c.Etcd.MaxTxnOps = 0 }, wantFields: []string{"etcd.max_txn_ops"}},
		{name: "transaction limit too high", edit: func(c *controller.Config) {
			c.Etcd.Endpoints, c.AdvertiseAddr, c.Etcd.MaxTxnOps = []string{"https://etcd-0:2379"}, "10.0.0.1:7070", 100000
		}, wantFields: []string{"etcd.max_txn_ops"}},
		{name: "transaction limit with embedded etcd", edit: func(c *controller.Config) { c.Etcd.MaxTxnOps = 1024 },
			wantFields: []string{"etcd.max_txn_ops"}},
		{name: "retention keeping nothing", edit: func(c *controller.Config) {
			c.Retention.MaxJobEvents, c.Retention.FinishedJobMaxAge.Duration = 0, 0
		}, wantFields: []string{"retention.max_job_events", "retention.finished_job_max_age"}},
		{name: "lost nodes kept for no time", edit: func(c *controller.Config) { c.Retention.LostNodeMaxAge.Duration = 0 },
			wantFields: []string{"retention.lost_node_max_age"}},
		{name: "no active jobs allowed", edit: func(c *controller.Config) { c.Limits.MaxActiveJobs = 0 },
			wantFields: []string{"limits.max_active_jobs"}},
		{name: "listen without port", edit: func(c *controller.Config) { c.Listen = "0.0.0.0" }, wantFields: []string{"listen"}},
		{name: "embedded etcd without data dir", edit: func(c *controller.Config) { c.DataDir = "" }, wantFields: []string{"data_dir"}},
		{name: "data dir too long for the etcd socket", edit: func(c *controller.Config) { c.DataDir = "/var/lib/" + strings.Repeat("d", 100) },
			wantFields: []string{"data_dir"}},
		{name: "zero dial timeout", edit: func(c *controller.Config) { c.Etcd.DialTimeout.Duration = 0 }, wantFields: []string{"etcd.dial_timeout"}},
		{name: "zero heartbeat interval", edit: func(c *controller.Config) { c.Heartbeat.Interval.Duration = 0 },
			wantFields: []string{"heartbeat.interval"}},
		{name: "timeout under two intervals", edit: func(c *controller.Config) {
			c.Heartbeat.Interval.Duration, c.Heartbeat.Timeout.Duration = time.Second, 1999*time.Millisecond
		}, wantFields: []string{"heartbeat.timeout"}},
		{name: "timeout of exactly two intervals", edit: func(c *controller.Config) {
			c.Heartbeat.Interval.Duration, c.Heartbeat.Timeout.Duration = time.Second, 2*time.Second
		}},
		{name: "no tls files", edit: func(c *controller.Config) { c.TLS.Files = pki.Files{} }, wantFields: []string{"tls.cert", "tls.key", "tls.ca"}},
		{name: "no ca file", edit: func(c *controller.Config) { c.TLS.CA = "" }, wantFields: []string{"tls.ca"}},
		{name: "insecure needs no tls files", edit: func(c *controller.Config) { c.TLS, c.Insecure = controller.TLSConfig{}, true }},
		{name: "zero reverify interval", edit: func(c *controller.Config) { c.TLS.ReverifyInterval.Duration = 0 }, wantFields: []string{"tls.reverify_interval"}},
		{name: "zero max handshakes", edit: func(c *controller.Config) { c.TLS.MaxHandshakes = 0 }, wantFields: []string{"tls.max_handshakes"}},
		{name: "privileged master ports", edit: func(c *controller.Config) { c.MasterPortRange.Min = 1000 },
			wantFields: []string{"master_port_range"}},
		{name: "master ports beyond 65535", edit: func(c *controller.Config) { c.MasterPortRange.Max = 65536 },
			wantFields: []string{"master_port_range"}},
		{name: "inverted master ports", edit: func(c *controller.Config) { c.MasterPortRange = controller.PortRange{Min: 30000, Max: 29999} },
			wantFields: []string{"master_port_range"}},
		{name: "one master port", edit: func(c *controller.Config) { c.MasterPortRange = controller.PortRange{Min: 29500, Max: 29500} }},
		{name: "metrics off", edit: func(c *controller.Config) { c.HTTP.Listen = "" }},
		{name: "metrics on every address", edit: func(c *controller.Config) { c.HTTP.Listen = ":9401" }},
		{name: "metrics address without port", edit: func(c *controller.Config) { c.HTTP.Listen = "127.0.0.1" }, wantFields: []string{"http.listen"}},
		{name: "metrics port not a number", edit: func(c *controller.Config) { c.HTTP.Listen = "127.0.0.1:metrics" }, wantFields: []string{"http.listen"}},
		{name: "metrics certificate without key", edit: func(c *controller.Config) { c.HTTP.CertFile = "/etc/rdzv/pki/m.crt" },
			wantFields: []string{"http.key_file"}},
		{name: "metrics client CA without https", edit: func(c *controller.Config) { c.HTTP.ClientCAFile = "/etc/rdzv/pki/ca.crt" },
			wantFields: []string{"http.client_ca_file"}},
		{name: "every problem at once", edit: func(c *controller.Config) {
			c.Listen, c.DataDir, c.Heartbeat.Interval.Duration, c.MasterPortRange.Min = "x", "", 0, 0
		}, wantFields: []string{"listen", "data_dir", "heartbeat.interval", "master_port_range"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := controller.DefaultConfig()
			c.TLS.Files = pki.Files{Cert: "/etc/rdzv/pki/controller.crt", Key: "/etc/rdzv/pki/controller.key", CA: "/etc/rdzv/pki/ca.crt"}
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

			_, err = controller.New(c, testLogger(t))
			require.ErrorContains(t, err, "invalid controller config")
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

	cfg, _, err := controller.LoadConfig(write("controller.yaml", `
listen: 10.0.0.1:7070
heartbeat: {interval: 250ms, timeout: 3s}
etcd: {endpoints: ["http://etcd-0:2379"]}
master_port_range: {min: 40000, max: 40100}
tls: {cert: /etc/rdzv/pki/controller.crt, key: /etc/rdzv/pki/controller.key, ca: /etc/rdzv/pki/ca.crt, reverify_interval: 30s}
`))
	require.NoError(t, err)
	require.NoError(t, cfg.Validate())
	require.Equal(t, pki.Files{Cert: "/etc/rdzv/pki/controller.crt", Key: "/etc/rdzv/pki/controller.key", CA: "/etc/rdzv/pki/ca.crt"}, cfg.TLS.Files)
	require.Equal(t, 30*time.Second, cfg.TLS.ReverifyInterval.Duration)
	require.Equal(t, "10.0.0.1:7070", cfg.Listen)
	require.Equal(t, 250*time.Millisecond, cfg.Heartbeat.Interval.Duration)
	require.Equal(t, 3*time.Second, cfg.Heartbeat.Timeout.Duration)
	require.False(t, cfg.Embedded())
	require.Equal(t, controller.PortRange{Min: 40000, Max: 40100}, cfg.MasterPortRange)
	require.Equal(t, controller.DefaultConfig().Etcd.DialTimeout, cfg.Etcd.DialTimeout, "unset fields keep their defaults")

	_, _, err = controller.LoadConfig(write("typo.yaml", "heartbeat: {intervall: 1s}\n"))
	require.ErrorContains(t, err, "line 1, column 13: heartbeat.intervall: unknown field; did you mean interval?", "an unknown field is an error, not a silent default")
	_, _, err = controller.LoadConfig(write("number.yaml", "heartbeat: {interval: 5}\n"))
	require.ErrorContains(t, err, "line 1, column 23: heartbeat.interval: expected a duration like 30s, 5m or 1h30m, got number 5")
	_, _, err = controller.LoadConfig(filepath.Join(dir, "missing.yaml"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestShippedConfig keeps deploy/config/controller.yaml loadable: secure,
// with its TLS files set.
func TestShippedConfig(t *testing.T) {
	cfg, _, err := controller.LoadConfig(filepath.Join("..", "deploy", "config", "controller.yaml"))
	require.NoError(t, err)
	require.NoError(t, cfg.Validate())
	require.False(t, cfg.Insecure)
	require.Equal(t, "/etc/rdzv/pki/controller.crt", cfg.TLS.Cert)
	require.Equal(t, controller.DefaultHTTPListen, cfg.HTTP.Listen, "the file says the default metrics address")
}
