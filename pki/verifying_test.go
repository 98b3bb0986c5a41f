package pki_test

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// A VerifyingServerConfig's handshake admits only a client certificate
// that verifies against the CA and that accept (here a deny-list)
// accepts; the server's handshake fails for any other.
func TestVerifyingServerConfig(t *testing.T) {
	ca := newCA(t)
	clock := clockwork.NewFakeClockAt(now)
	srv, err := pki.NewReloader(writeSet(t, t.TempDir(), ca, issue(t, ca, pki.RoleRelay, "rack-1")), nil, zaptest.NewLogger(t), pki.WithClock(clock))
	require.NoError(t, err)
	deny := pki.NewDenyList()
	revoked := issue(t, ca, pki.RoleAgent, "node-r")
	deny.Add(&rdzvv1.Revocation{Target: &rdzvv1.Revocation_Serial{Serial: pki.Serial(revoked.Cert)},
		RevokedAt: timestamppb.New(now), NotAfter: timestamppb.New(now.Add(time.Hour))})
	srvConf := srv.VerifyingServerConfig(deny.Check)
	srvConf.SessionTicketsDisabled = true // net.Pipe is unbuffered, and nothing reads them

	certOf := func(is *pki.Issued) []tls.Certificate {
		return []tls.Certificate{{Certificate: [][]byte{is.Cert.Raw}, PrivateKey: is.Key}}
	}
	tests := []struct {
		name    string
		certs   []tls.Certificate
		wantErr string
	}{
		{"an agent of the CA", certOf(issue(t, ca, pki.RoleAgent, "node-a")), ""},
		{"no certificate", nil, "client didn't provide a certificate"},
		{"another CA's agent", certOf(issue(t, newCA(t), pki.RoleAgent, "node-a")), "not signed by the cluster CA"},
		{"a revoked agent", certOf(revoked), "revoked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			done := make(chan error, 1)
			go func() {
				err := tls.Client(b, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, Certificates: tt.certs}).Handshake()
				_ = b.Close()
				done <- err
			}()
			err := tls.Server(a, srvConf).Handshake()
			<-done
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}
