package controller

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// testGuard is a guard with TLS. Its reloader verifies on the wall clock,
// so its CA and certificate are valid now.
func testGuard(t *testing.T) *guard {
	t.Helper()
	ca, err := pki.NewCA("test-ca", 10*365*24*time.Hour, time.Now())
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, ca.Save(dir, false))
	ctl, err := ca.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleController, Name: "ctl"}, ValidFor: 48 * time.Hour, Now: time.Now()})
	require.NoError(t, err)
	cert, key, err := ctl.Save(filepath.Join(dir, "controller"), false)
	require.NoError(t, err)
	cfg := DefaultConfig()
	cfg.TLS.Files = pki.Files{Cert: cert, Key: key, CA: filepath.Join(dir, pki.CACertFile)}
	g, err := newGuard(cfg, clockwork.NewFakeClockAt(revokeNow), zaptest.NewLogger(t), newMetrics())
	require.NoError(t, err)
	return g
}

func insecureGuard(t *testing.T) *guard {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Insecure = true
	g, err := newGuard(cfg, clockwork.NewFakeClockAt(revokeNow), zaptest.NewLogger(t), newMetrics())
	require.NoError(t, err)
	return g
}

func asCaller(id string) context.Context {
	ident, err := pki.ParseIdentity(id)
	if err != nil {
		panic(err)
	}
	return context.WithValue(context.Background(), identityKey{}, ident)
}

// A revocation request becomes the entry it asks for, bounded by the CA's
// expiry, or is refused.
func TestGuardRevocation(t *testing.T) {
	g := testGuard(t)
	caNotAfter := g.tls.CANotAfter()
	soon := revokeNow.Add(time.Hour)
	tests := []struct {
		name         string
		req          *rdzvv1.RevokeCertificateRequest
		wantCode     codes.Code // codes.OK: made
		want         *rdzvv1.Revocation
		wantNode     string
		wantNotAfter time.Time
	}{
		{
			name: "serial", req: &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Serial{Serial: "0a1B"}, Reason: "stolen"},
			want:         &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Serial{Serial: "a1b"}, Reason: "stolen"},
			wantNotAfter: caNotAfter,
		},
		{
			name: "serial until its certificate expires", req: &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Serial{Serial: "0a1b"}, NotAfter: timestamppb.New(soon)},
			want:         &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Serial{Serial: "a1b"}},
			wantNotAfter: soon,
		},
		{
			name: "serial past the CA", req: &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Serial{Serial: "0a1b"}, NotAfter: timestamppb.New(caNotAfter.Add(time.Hour))},
			want:         &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Serial{Serial: "a1b"}},
			wantNotAfter: caNotAfter,
		},
		{
			name: "serial already expired", req: &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Serial{Serial: "0a1b"}, NotAfter: timestamppb.New(revokeNow)},
			wantCode: codes.InvalidArgument,
		},
		{
			name: "agent", req: &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Identity{Identity: "agent/gpu-01"}},
			want:         &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Identity{Identity: "agent/gpu-01"}, IssuedBefore: timestamppb.New(revokeNow)},
			wantNode:     "gpu-01",
			wantNotAfter: caNotAfter,
		},
		{
			name: "operator", req: &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Identity{Identity: "operator/bob"}},
			want:         &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Identity{Identity: "operator/bob"}, IssuedBefore: timestamppb.New(revokeNow)},
			wantNotAfter: caNotAfter,
		},
		{name: "bad identity", req: &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Identity{Identity: "bob"}}, wantCode: codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, node, err := g.revocation(asCaller("operator/alice"), tt.req, revokeNow)
			if tt.wantCode != codes.OK {
				require.Equal(t, tt.wantCode, status.Code(err), "%v", err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantNode, node)
			require.Equal(t, "operator/alice", r.GetRevokedBy())
			require.Equal(t, revokeNow, r.GetRevokedAt().AsTime())
			require.Equal(t, tt.wantNotAfter, r.GetNotAfter().AsTime())
			require.Equal(t, tt.want.GetSerial(), r.GetSerial())
			require.Equal(t, tt.want.GetIdentity(), r.GetIdentity())
			require.Equal(t, tt.want.GetIssuedBefore().AsTime(), r.GetIssuedBefore().AsTime())
			require.Equal(t, tt.want.GetReason(), r.GetReason())
			require.NoError(t, validateRevocation(r), "what it stores reads back valid")
		})
	}

	_, _, err := insecureGuard(t).revocation(asCaller("operator/alice"), &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Serial{Serial: "0a"}}, revokeNow)
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "no certificates to revoke without TLS")
}

// Loading keeps only the valid entries stored under their own key;
// expiring drops those whose certificates have all expired.
func TestGuardRevocationsLoadAndExpire(t *testing.T) {
	g := insecureGuard(t)
	ca := testCA(t)
	cert := issueAt(t, ca, "operator/bob", revokeNow.Add(-time.Hour))
	short := bySerial(cert, revokeNow.Add(time.Hour))
	long := byIdentity("agent/gpu-01", revokeNow, revokeNow.Add(48*time.Hour))
	invalid := byIdentity("agent/gpu-02", revokeNow, revokeNow.Add(time.Hour))
	invalid.IssuedBefore = nil
	g.loadRevocations(map[string]*rdzvv1.Revocation{
		store.RevocationKey(short):      short,
		store.RevocationKey(long):       long,
		"elsewhere":                     byIdentity("agent/gpu-03", revokeNow, revokeNow.Add(time.Hour)),
		store.RevocationKey(long) + "x": invalid,
	}, []store.Unreadable{{Key: "garbled", Err: errors.New("not a record")}})
	require.Len(t, g.revoked.list(), 2)

	require.Empty(t, g.expireRevocations(revokeNow.Add(time.Minute)))
	expired := g.expireRevocations(revokeNow.Add(2 * time.Hour))
	require.Len(t, expired, 1)
	require.Equal(t, short.GetSerial(), expired[0].GetSerial())
	require.Len(t, g.revoked.list(), 1)
}

// A reload asks for re-verification; one refused for an untrusted own
// certificate is kept for reporting; one caught halfway waits for the next.
func TestGuardReloaded(t *testing.T) {
	tests := []struct {
		name        string
		err         error
		wantKick    bool
		wantRefused bool
	}{
		{name: "reloaded", wantKick: true},
		{name: "own certificate untrusted", err: pki.ErrOwnCertUntrusted, wantKick: true, wantRefused: true},
		{name: "rotation halfway", err: errors.New("key does not match")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := insecureGuard(t)
			g.reloaded(tt.err)
			select {
			case <-g.reverifyKick:
				require.True(t, tt.wantKick)
			default:
				require.False(t, tt.wantKick)
			}
			require.Equal(t, tt.wantRefused, g.reloadRefused.Load() != nil)
		})
	}
}

// An agent registers only as the node its certificate names; without TLS
// there is no certificate to check.
func TestGuardCheckNodeIdentity(t *testing.T) {
	g := testGuard(t)
	require.NoError(t, g.checkNodeIdentity(asCaller("agent/gpu-01"), "gpu-01"))
	require.Equal(t, codes.PermissionDenied, status.Code(g.checkNodeIdentity(asCaller("agent/gpu-01"), "gpu-02")))
	require.Equal(t, codes.PermissionDenied, status.Code(g.checkNodeIdentity(asCaller("operator/gpu-01"), "gpu-01")))
	require.NoError(t, insecureGuard(t).checkNodeIdentity(context.Background(), "gpu-01"))
}
