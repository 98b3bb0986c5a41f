package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/pki"
)

// A call cut short because rdzvctl's own certificate expired says so,
// instead of blaming the network.
func TestExpiredCertificateIsNamed(t *testing.T) {
	now := time.Now()
	ca, err := pki.NewCA("test-ca", 24*time.Hour, now.Add(-12*time.Hour))
	require.NoError(t, err)
	op := pki.Identity{Role: pki.RoleOperator, Name: "alice"}
	tests := []struct {
		name     string
		issuedAt time.Time
		code     codes.Code
		want     string
	}{
		{"expired, connection dropped", now.Add(-3 * time.Hour), codes.Unavailable, "this client's certificate"},
		{"expired, refused", now.Add(-3 * time.Hour), codes.Unauthenticated, "expired at"},
		{"valid, connection dropped", now.Add(-time.Minute), codes.Unavailable, "cannot reach the controller"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			is, err := ca.Issue(pki.Request{Identity: op, ValidFor: time.Hour, Now: tt.issuedAt})
			require.NoError(t, err)
			_, _, err = is.Save(filepath.Join(dir, "rdzvctl"), false)
			require.NoError(t, err)
			c := &command{globals: &globals{controller: "127.0.0.1:7070", tlsDir: dir, timeout: time.Second}}
			err = c.rpcErr("following logs", status.Error(tt.code, "connection closed"))
			require.ErrorContains(t, err, tt.want)
			if tt.issuedAt.Add(time.Hour).Before(now) {
				require.ErrorContains(t, err, "expired at")
				require.ErrorContains(t, err, "pki issue operator")
				require.NotContains(t, err.Error(), "cannot reach")
			}
		})
	}
}
