package controller

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/credentials"

	"github.com/rdzv/rdzv/pki"
)

// The splitter hands a verified client to the API server and an
// unverified one to the pre-authentication server, and closes a new
// unverified connection while maxPreauthConns are open; closing one frees
// its place.
func TestSplitterBoundsUnverifiedConnections(t *testing.T) {
	ca, err := pki.NewCA("test", time.Hour, time.Now())
	require.NoError(t, err)
	issue := func(role pki.Role, ips ...net.IP) tls.Certificate {
		is, err := ca.Issue(pki.Request{Identity: pki.Identity{Role: role, Name: "x"}, IPs: ips, ValidFor: time.Minute, Now: time.Now()})
		require.NoError(t, err)
		return tls.Certificate{Certificate: [][]byte{is.Cert.Raw}, PrivateKey: is.Key, Leaf: is.Cert}
	}
	server, operator := issue(pki.RoleController, net.IPv4(127, 0, 0, 1)), issue(pki.RoleOperator)
	// The operator's certificate verifies, no other.
	verify := func(chain pki.Chain) error {
		if certs := chain(); len(certs) == 0 || !bytes.Equal(certs[0].Raw, operator.Leaf.Raw) {
			return pki.ErrNoCertificate
		}
		return nil
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	clock := clockwork.NewFakeClock()
	creds := credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{server}, ClientAuth: tls.RequestClientCert})
	s := newSplitter(lis, creds, verify, newClientConns(clock, zaptest.NewLogger(t)), clock, zaptest.NewLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-ran)
	}()

	dial := func(cert *tls.Certificate) *tls.Conn {
		conf := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, NextProtos: []string{"h2"}}
		if cert != nil {
			conf.Certificates = []tls.Certificate{*cert}
		}
		conn, err := tls.Dial("tcp", lis.Addr().String(), conf)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	accept := func(q *connQueue) *handedConn {
		conn, err := q.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		return conn.(*handedConn)
	}

	tests := []struct {
		name string
		cert *tls.Certificate
		to   *connQueue
		info func(credentials.AuthInfo) bool
	}{
		{"operator", &operator, s.api, func(i credentials.AuthInfo) bool { _, ok := i.(connInfo); return ok }},
		{"no certificate", nil, s.pre, func(i credentials.AuthInfo) bool { _, ok := i.(preauthInfo); return ok }},
		{"a certificate that does not verify", &server, s.pre, func(i credentials.AuthInfo) bool { _, ok := i.(preauthInfo); return ok }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dial(tt.cert)
			require.True(t, tt.info(accept(tt.to).info))
		})
	}

	// The two unverified connections above hold places; fill the rest.
	held := []*handedConn{}
	for range maxPreauthConns - 2 {
		dial(nil)
		held = append(held, accept(s.pre))
	}
	over := dial(nil)
	// Closed by the controller after its handshake: the read ends.
	_, err = over.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)

	require.NoError(t, held[0].Close())
	dial(nil)
	require.True(t, tests[1].info(accept(s.pre).info), "a freed place is taken")
}
