package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/internal/testaddr"
	"github.com/rdzv/rdzv/pki"
)

// TestPKIRevoke runs `rdzvctl pki revoke` and `pki revocations` against a
// real controller: entries by identity and by certificate file are listed,
// and an operator who revokes their own identity is refused from then on.
func TestPKIRevoke(t *testing.T) {
	caDir, tlsDir := t.TempDir(), t.TempDir()
	runOK(t, "pki", "init", "--dir", caDir)
	runOK(t, "pki", "issue", "controller", "ctl", "--ip", "127.0.0.1", "--dir", caDir)
	runOK(t, "pki", "issue", "operator", "alice", "--dir", caDir, "--out", filepath.Join(tlsDir, "rdzvctl"))
	runOK(t, "pki", "issue", "agent", "gpu-02", "--dir", caDir)
	data, err := os.ReadFile(filepath.Join(caDir, pki.CACertFile))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(tlsDir, pki.CACertFile), data, 0o644))

	cfg := controller.DefaultConfig()
	cfg.DataDir, cfg.Listen = t.TempDir(), testaddr.Free(t)
	cfg.TLS.Files = pki.Files{Cert: filepath.Join(caDir, "controller-ctl.crt"), Key: filepath.Join(caDir, "controller-ctl.key"), CA: filepath.Join(caDir, pki.CACertFile)}
	ctl, err := controller.New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	ctlArgs := func(args ...string) []string {
		return append([]string{"--controller", cfg.Listen, "--tls-dir", tlsDir}, args...)
	}
	require.Eventually(t, func() bool {
		code, _ := run(context.Background(), ctlArgs("pki", "revocations"), &bytes.Buffer{}, io.Discard)
		return code == 0
	}, 30*time.Second, 50*time.Millisecond, "the controller never served")

	require.Contains(t, runOK(t, ctlArgs("version")...), ", leader "+cfg.Listen+"\n", "the controller says what it is")

	out := runOK(t, ctlArgs("pki", "revoke", "agent/gpu-01", "--reason", "decommissioned")...)
	require.Contains(t, out, "revoked every certificate of agent/gpu-01 issued until now")
	agentCert, err := pki.ReadCert(filepath.Join(caDir, "agent-gpu-02.crt"))
	require.NoError(t, err)
	out = runOK(t, ctlArgs("pki", "revoke", "--cert", filepath.Join(caDir, "agent-gpu-02.crt"))...)
	require.Contains(t, out, "revoked certificate serial "+pki.Serial(agentCert))
	require.Contains(t, out, "on the deny-list until "+agentCert.NotAfter.UTC().Format(time.RFC3339), "kept as long as the certificate lives")

	out = runOK(t, ctlArgs("pki", "revocations")...)
	require.Contains(t, out, "agent/gpu-01")
	require.Contains(t, out, "decommissioned")
	require.Contains(t, out, pki.Serial(agentCert))
	var list struct {
		Revocations []struct {
			Serial    string `json:"serial"`
			Identity  string `json:"identity"`
			RevokedBy string `json:"revoked_by"`
		} `json:"revocations"`
	}
	require.NoError(t, json.Unmarshal([]byte(runOK(t, ctlArgs("-o", "json", "pki", "revocations")...)), &list))
	require.Len(t, list.Revocations, 2)
	for _, r := range list.Revocations {
		require.Equal(t, "operator/alice", r.RevokedBy)
	}

	runOK(t, ctlArgs("pki", "revoke", "operator/alice")...)
	var stdout bytes.Buffer
	code, err := run(context.Background(), ctlArgs("pki", "revocations"), &stdout, io.Discard)
	require.Equal(t, 1, code)
	require.ErrorContains(t, err, "certificate operator/alice (serial ")
	require.ErrorContains(t, err, "revoked at")
}
