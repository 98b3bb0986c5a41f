package relay

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/pki"
)

func TestValidate(t *testing.T) {
	good := DefaultConfig()
	good.Controller = "10.0.0.1:7070"
	good.TLS = pki.Files{Cert: "relay.crt", Key: "relay.key", CA: "ca.crt"}
	require.NoError(t, good.Validate())
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no controller", func(c *Config) { c.Controller = "" }, "controller: \"\" is not host:port"},
		{"bad controller", func(c *Config) { c.Controller = "10.0.0.1" }, `controller: "10.0.0.1" is not host:port`},
		{"bad listen", func(c *Config) { c.Listen = "7071" }, `listen: "7071" is not host:port`},
		{"no certificate", func(c *Config) { c.TLS = pki.Files{} }, "tls.cert: required"},
		{"bad http", func(c *Config) { c.HTTP.Listen = "nowhere" }, `http.listen: "nowhere" is not host:port`},
		{"revocations read too often", func(c *Config) { c.RevocationsRefresh.Duration = time.Millisecond }, "revocations_refresh: must be at least 1s, got 1ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			tt.edit(&cfg)
			require.ErrorContains(t, cfg.Validate(), tt.want)
			_, err := New(cfg, nil)
			require.ErrorContains(t, err, "invalid relay config")
		})
	}
}

// TestShippedConfig keeps deploy/config/relay.yaml loadable and at the
// defaults it states.
func TestShippedConfig(t *testing.T) {
	cfg, _, err := LoadConfig(filepath.Join("..", "deploy", "config", "relay.yaml"))
	require.NoError(t, err)
	require.NoError(t, cfg.Validate())
	require.Equal(t, DefaultListen, cfg.Listen)
	require.Equal(t, DefaultHTTPListen, cfg.HTTP.Listen)
	require.Equal(t, "/etc/rdzv/pki/relay.crt", cfg.TLS.Cert)
	require.Equal(t, DefaultConfig().RevocationsRefresh, cfg.RevocationsRefresh)
}

func TestLoadConfigRefusesUnknownFields(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.yaml")
	require.NoError(t, os.WriteFile(path, []byte("controler: 10.0.0.1:7070\n"), 0o600))
	_, _, err := LoadConfig(path)
	require.ErrorContains(t, err, path+": line 1, column 1: controler: unknown field; did you mean controller?")
}
