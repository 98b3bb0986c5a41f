package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

var revokeNow = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func testCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("test-ca", 10*365*24*time.Hour, revokeNow.Add(-24*time.Hour))
	require.NoError(t, err)
	return ca
}

// issueAt issues a certificate of id at issued, valid for a day.
func issueAt(t *testing.T, ca *pki.CA, id string, issued time.Time) *x509.Certificate {
	t.Helper()
	ident, err := pki.ParseIdentity(id)
	require.NoError(t, err)
	is, err := ca.Issue(pki.Request{Identity: ident, ValidFor: 24 * time.Hour, Now: issued})
	require.NoError(t, err)
	return is.Cert
}

func bySerial(cert *x509.Certificate, notAfter time.Time) *rdzvv1.Revocation {
	return &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Serial{Serial: pki.Serial(cert)}, NotAfter: timestamppb.New(notAfter),
		RevokedAt: timestamppb.New(revokeNow), RevokedBy: "operator/alice", Reason: "laptop stolen"}
}

func byIdentity(id string, before, notAfter time.Time) *rdzvv1.Revocation {
	return &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Identity{Identity: id}, IssuedBefore: timestamppb.New(before),
		NotAfter: timestamppb.New(notAfter), RevokedAt: timestamppb.New(before), RevokedBy: "operator/alice"}
}

func TestDenyListCheck(t *testing.T) {
	ca := testCA(t)
	stolen := issueAt(t, ca, "operator/bob", revokeNow.Add(-time.Hour))
	bobsOther := issueAt(t, ca, "operator/bob", revokeNow.Add(-time.Hour))
	oldAgent := issueAt(t, ca, "agent/gpu-01", revokeNow.Add(-2*time.Hour))
	// Issued one minute after the revocation: its NotBefore is backdated
	// by five minutes, to before it, and must not count as earlier.
	reissued := issueAt(t, ca, "agent/gpu-01", revokeNow.Add(time.Minute))
	otherNode := issueAt(t, ca, "agent/gpu-02", revokeNow.Add(-2*time.Hour))
	sameNameOtherRole := issueAt(t, ca, "operator/gpu-01", revokeNow.Add(-2*time.Hour))

	d := newDenyList()
	d.Replace([]*rdzvv1.Revocation{
		bySerial(stolen, revokeNow.Add(time.Hour)),
		byIdentity("agent/gpu-01", revokeNow, revokeNow.Add(time.Hour)),
	})
	tests := []struct {
		name    string
		cert    *x509.Certificate
		wantErr []string // nil: accepted
	}{
		{"revoked by serial", stolen, []string{"certificate operator/bob (serial " + pki.Serial(stolen) + ") revoked at 2030-01-02T03:04:05Z by operator/alice: laptop stolen"}},
		{"another certificate of the same identity", bobsOther, nil},
		{"revoked by identity", oldAgent, []string{"certificate agent/gpu-01 (serial " + pki.Serial(oldAgent) + ") revoked", "every certificate of agent/gpu-01 issued before 2030-01-02T03:04:05Z"}},
		{"issued after the identity's revocation", reissued, nil},
		{"another node", otherNode, nil},
		{"the same name in another role", sameNameOtherRole, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := d.Check(verifiedAs(t, tt.cert))
			if tt.wantErr == nil {
				require.NoError(t, err)
				return
			}
			var revoked *pki.RevokedError
			require.ErrorAs(t, err, &revoked)
			for _, want := range tt.wantErr {
				require.ErrorContains(t, err, want)
			}
		})
	}

	// Revoking the identity again, later, covers the reissued certificate
	// too: the newer entry replaces the older.
	d.Add(byIdentity("agent/gpu-01", revokeNow.Add(time.Hour), revokeNow.Add(2*time.Hour)))
	require.Error(t, d.Check(verifiedAs(t, reissued)))
	require.Len(t, d.list(), 2)
}

func TestDenyListExpire(t *testing.T) {
	ca := testCA(t)
	a, b := issueAt(t, ca, "viewer/a", revokeNow), issueAt(t, ca, "viewer/b", revokeNow)
	d := newDenyList()
	d.Replace([]*rdzvv1.Revocation{
		bySerial(a, revokeNow.Add(time.Hour)),
		bySerial(b, revokeNow.Add(3*time.Hour)),
		byIdentity("agent/gpu-01", revokeNow, revokeNow.Add(2*time.Hour)),
	})
	tests := []struct {
		at       time.Time
		dropped  []string
		leftKeys int
	}{
		{revokeNow.Add(time.Hour), nil, 3},
		{revokeNow.Add(time.Hour + time.Second), []string{"certificate serial " + pki.Serial(a)}, 2},
		{revokeNow.Add(2*time.Hour + time.Second), []string{"every certificate of agent/gpu-01 issued before 2030-01-02T03:04:05Z"}, 1},
		{revokeNow.Add(24 * time.Hour), []string{"certificate serial " + pki.Serial(b)}, 0},
	}
	for _, tt := range tests {
		var dropped []string
		for _, r := range d.Expire(tt.at) {
			dropped = append(dropped, revocationTarget(r))
		}
		require.Equal(t, tt.dropped, dropped, "at %s", tt.at)
		require.Len(t, d.list(), tt.leftKeys)
	}
	require.NoError(t, d.Check(verifiedAs(t, a)), "a dropped entry no longer refuses")
}

// verifiedAs is what verifying cert gives the deny-list to check.
func verifiedAs(t *testing.T, cert *x509.Certificate) pki.ClientVerification {
	id, err := pki.IdentityOf(cert)
	require.NoError(t, err)
	return pki.ClientVerification{ID: id, Serial: pki.Serial(cert), IssuedAt: pki.IssuedAt(cert)}
}

func TestValidateRevocation(t *testing.T) {
	at := timestamppb.New(revokeNow)
	tests := []struct {
		name    string
		r       *rdzvv1.Revocation
		wantErr string
	}{
		{"serial", &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Serial{Serial: "1f2e"}, NotAfter: at}, ""},
		{"identity", &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Identity{Identity: "agent/gpu-01"}, IssuedBefore: at, NotAfter: at}, ""},
		{"serial not as stored", &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Serial{Serial: "1F:2E"}, NotAfter: at}, `serial: want "1f2e" as stored`},
		{"identity without issued_before", &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Identity{Identity: "agent/gpu-01"}, NotAfter: at}, "issued_before:"},
		{"bad identity", &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Identity{Identity: "agent/../../jobs/x"}, IssuedBefore: at, NotAfter: at}, "name: must be a DNS-1123 label"},
		{"no target", &rdzvv1.Revocation{NotAfter: at}, "serial, identity: one is required"},
		{"no not_after", &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Serial{Serial: "1f2e"}}, "not_after:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := validateRevocation(tt.r)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// testAuthenticator is an authenticator over a real reloader of ca's
// files, with the deny-list it consults.
func testAuthenticator(t *testing.T, ca *pki.CA, clock clockwork.Clock) *authenticator {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, ca.Save(dir, false))
	ctl, err := ca.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleController, Name: "ctl"}, ValidFor: 48 * time.Hour, Now: clock.Now()})
	require.NoError(t, err)
	cert, key, err := ctl.Save(filepath.Join(dir, "controller"), false)
	require.NoError(t, err)
	r, err := pki.NewReloader(pki.Files{Cert: cert, Key: key, CA: filepath.Join(dir, pki.CACertFile)}, wantController, zaptest.NewLogger(t), pki.WithClock(clock))
	require.NoError(t, err)
	return &authenticator{tls: r, revoked: newDenyList(), log: zaptest.NewLogger(t)}
}

// peerWith is a call's context from a peer that presented chain.
func peerWith(chain ...*x509.Certificate) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{
		Addr:     &net.TCPAddr{IP: net.IPv4(10, 0, 0, 9), Port: 5000},
		AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: chain}},
	})
}

func TestAuthenticatorRefusesRevoked(t *testing.T) {
	clock := clockwork.NewFakeClockAt(revokeNow)
	ca := testCA(t)
	a := testAuthenticator(t, ca, clock)
	revoked := issueAt(t, ca, "agent/gpu-01", revokeNow.Add(-time.Hour))
	byID := issueAt(t, ca, "operator/bob", revokeNow.Add(-time.Hour))
	fine := issueAt(t, ca, "agent/gpu-02", revokeNow.Add(-time.Hour))
	foreign := issueAt(t, testCA(t), "agent/gpu-03", revokeNow.Add(-time.Hour))
	a.revoked.Replace([]*rdzvv1.Revocation{
		bySerial(revoked, revokeNow.Add(time.Hour)),
		byIdentity("operator/bob", revokeNow, revokeNow.Add(time.Hour)),
	})
	const connect = rdzvv1.AgentService_Connect_FullMethodName
	tests := []struct {
		name     string
		ctx      context.Context
		method   string
		wantCode codes.Code
		wantMsg  []string
	}{
		{"accepted", peerWith(fine), connect, codes.OK, nil},
		{"revoked serial", peerWith(revoked), connect, codes.Unauthenticated, []string{"certificate agent/gpu-01 (serial " + pki.Serial(revoked) + ") revoked at"}},
		{"revoked identity", peerWith(byID), rdzvv1.JobService_ListJobs_FullMethodName, codes.Unauthenticated, []string{"operator/bob", "revoked", "issued before"}},
		{"foreign CA", peerWith(foreign), connect, codes.Unauthenticated, []string{"certificate not signed by the cluster CA"}},
		{"no certificate", peerWith(), connect, codes.Unauthenticated, []string{"no client certificate"}},
		{"accepted but not allowed", peerWith(fine), rdzvv1.CertificateService_RevokeCertificate_FullMethodName, codes.PermissionDenied, []string{"agent/gpu-02 (role agent) may not call"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, err := a.check(tt.ctx, tt.method)
			require.Equal(t, tt.wantCode, status.Code(err), "%v", err)
			for _, want := range tt.wantMsg {
				require.Contains(t, status.Convert(err).Message(), want)
			}
			if tt.wantCode == codes.OK {
				id, ok := identityFrom(ctx)
				require.True(t, ok)
				require.Equal(t, "agent/gpu-02", id.String())
			}
		})
	}
}

// trackedPeer is a call's context on a tracked connection.
func trackedPeer(cc *clientConn) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{
		Addr:     &net.TCPAddr{IP: net.IPv4(10, 0, 0, 9), Port: 5000},
		AuthInfo: connInfo{TLSInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: cc.chain()}}, conn: cc},
	})
}

// pipeConn is one end of an in-memory connection that reports when it is
// closed.
func pipeConn(t *testing.T) (net.Conn, <-chan struct{}) {
	server, client := net.Pipe()
	closed := make(chan struct{})
	go func() {
		_, _ = client.Read(make([]byte, 1)) // returns when server closes
		close(closed)
	}()
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	return server, closed
}

// TestConnectionsEndWhenRefused: re-verification ends the streams of a
// connection whose certificate it refuses with Unauthenticated and the
// reason, refuses new streams on it, and closes it after the grace; other
// connections, and connections never authenticated, are left alone.
func TestConnectionsEndWhenRefused(t *testing.T) {
	clock := clockwork.NewFakeClockAt(revokeNow)
	ca := testCA(t)
	conns := newClientConns(clock, zaptest.NewLogger(t))
	revoked := issueAt(t, ca, "agent/gpu-01", revokeNow.Add(-time.Hour))
	kept := issueAt(t, ca, "agent/gpu-02", revokeNow.Add(-time.Hour))
	rawA, closedA := pipeConn(t)
	rawB, closedB := pipeConn(t)
	rawC, closedC := pipeConn(t)
	a := conns.add(rawA, pki.ChainOf([]*x509.Certificate{revoked}), leafOf(revoked), "a")
	b := conns.add(rawB, pki.ChainOf([]*x509.Certificate{kept}), leafOf(kept), "b")
	conns.add(rawC, pki.ChainOf([]*x509.Certificate{revoked}), leafOf(revoked), "c") // never authenticated
	a.accepted(pki.ClientVerification{})
	b.accepted(pki.ClientVerification{})

	streamA, doneA, err := trackStream(trackedPeer(a))
	require.NoError(t, err)
	defer doneA()
	streamB, doneB, err := trackStream(trackedPeer(b))
	require.NoError(t, err)
	defer doneB()

	why := errors.New("certificate agent/gpu-01 revoked")
	checked := 0
	conns.reverify(func(chain pki.Chain, _ pki.ClientVerification) (pki.ClientVerification, error) {
		checked++
		if chain()[0] == revoked {
			return pki.ClientVerification{}, why
		}
		return pki.ClientVerification{}, nil
	})
	require.Equal(t, 2, checked, "only authenticated connections are verified again")
	<-streamA.Done()
	refused := streamRefused(streamA)
	require.Equal(t, codes.Unauthenticated, status.Code(refused))
	require.Equal(t, why.Error(), status.Convert(refused).Message())
	require.NoError(t, streamB.Err(), "the other connection's stream goes on")
	require.NoError(t, streamRefused(streamB))
	_, _, err = trackStream(trackedPeer(a))
	require.Equal(t, codes.Unauthenticated, status.Code(err), "no new stream on an ended connection")

	select {
	case <-closedA:
		require.FailNow(t, "closed before its streams' status could reach the client")
	default:
	}
	require.NoError(t, clock.BlockUntilContext(context.Background(), 4)) // 3 expiry timers, 1 close
	clock.Advance(connCloseGrace)
	<-closedA
	select {
	case <-closedB:
		require.FailNow(t, "a connection whose certificate is fine was closed")
	case <-closedC:
		require.FailNow(t, "a connection never authenticated was closed")
	default:
	}
	conns.mu.Lock()
	_, tracked := conns.conns[a]
	left := len(conns.conns)
	conns.mu.Unlock()
	require.False(t, tracked, "a closed connection is forgotten")
	require.Equal(t, 1, left)
}

// TestConnectionEndsAtExpiry: a connection's streams end with
// Unauthenticated saying the certificate expired, when it does.
func TestConnectionEndsAtExpiry(t *testing.T) {
	clock := clockwork.NewFakeClockAt(revokeNow)
	ca := testCA(t)
	conns := newClientConns(clock, zaptest.NewLogger(t))
	cert := issueAt(t, ca, "agent/gpu-01", revokeNow.Add(-23*time.Hour)) // expires in an hour
	raw, closed := pipeConn(t)
	cc := conns.add(raw, pki.ChainOf([]*x509.Certificate{cert}), leafOf(cert), "a")
	stream, done, err := trackStream(trackedPeer(cc))
	require.NoError(t, err)
	defer done()

	require.NoError(t, clock.BlockUntilContext(context.Background(), 1))
	clock.Advance(time.Hour)
	<-stream.Done()
	refused := streamRefused(stream)
	require.Equal(t, codes.Unauthenticated, status.Code(refused))
	require.Contains(t, status.Convert(refused).Message(), "expired at "+cert.NotAfter.UTC().Format(time.RFC3339))
	require.NoError(t, clock.BlockUntilContext(context.Background(), 1))
	clock.Advance(connCloseGrace)
	<-closed
}
