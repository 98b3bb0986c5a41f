package controller_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// countingListener counts the bytes the controller reads from each
// connection, by the client's address.
type countingListener struct {
	net.Listener
	mu    sync.Mutex
	conns map[string]*countingConn
}

type countingConn struct {
	net.Conn
	read   atomic.Int64
	closed atomic.Bool
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

func (c *countingConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

func (l *countingListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cc := &countingConn{Conn: conn}
	l.mu.Lock()
	l.conns[conn.RemoteAddr().String()] = cc
	l.mu.Unlock()
	return cc, nil
}

func (l *countingListener) conn(client string) *countingConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[client]
}

// preauthReadBound is what the controller may read from a client whose
// certificate did not verify, with a certificate chain of ordinary size:
// the TLS handshake, HTTP/2's preface and settings, a call's headers
// (8 KiB at most) and the flow control window (64 KiB), with a TLS record
// of slack on each. docs/security.md states it.
const preauthReadBound = 128 << 10

// TestUnverifiedClientsAreNotRead sends 15 MB requests with no or a
// foreign certificate and counts the bytes the controller read from the
// connection before refusing and closing it; with a valid certificate the
// same request is read, and refused only for what it holds.
func TestUnverifiedClientsAreNotRead(t *testing.T) {
	lis := &countingListener{conns: map[string]*countingConn{}}
	c := startCluster(t, nil, func(l net.Listener) net.Listener { lis.Listener = l; return lis }, nil)
	foreignCA, err := pki.NewCA("foreign", 24*time.Hour, time.Now())
	require.NoError(t, err)
	foreign, err := foreignCA.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleOperator, Name: "mallory"}, ValidFor: time.Hour, Now: time.Now()})
	require.NoError(t, err)
	operator, err := c.ca.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleOperator, Name: "alice"}, ValidFor: time.Hour, Now: time.Now()})
	require.NoError(t, err)

	big := strings.Repeat("x", 15<<20)
	startJob := func(conn *grpc.ClientConn) error {
		_, err := rdzvv1.NewJobServiceClient(conn).StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: c.spec("big", 1, 1, big)})
		return err
	}
	health := func(service string) func(conn *grpc.ClientConn) error {
		return func(conn *grpc.ClientConn) error {
			resp, err := healthpb.NewHealthClient(conn).Check(rpcCtx(t), &healthpb.HealthCheckRequest{Service: service})
			if err == nil {
				require.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.GetStatus())
			}
			return err
		}
	}
	tests := []struct {
		name string
		cert *pki.Issued
		call func(*grpc.ClientConn) error
		want codes.Code
		// orClosed: the controller refuses without reading the rest of the
		// request and closes the connection, so a client still sending it
		// may find the connection reset before it reads the refusal
		// (Unavailable); what is read is the assertion that matters.
		orClosed bool
		// read says whether the request is read: only for a verified
		// certificate, or a health check.
		read bool
	}{
		{"no certificate, 15 MB StartJob", nil, startJob, codes.Unauthenticated, true, false},
		{"foreign CA, 15 MB StartJob", foreign, startJob, codes.Unauthenticated, true, false},
		{"no certificate, health check", nil, health(""), codes.OK, false, true},
		{"no certificate, 15 MB health check", nil, health(big), codes.ResourceExhausted, false, false},
		{"operator, 15 MB StartJob", operator, startJob, codes.InvalidArgument, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var client atomic.Value
			conn := dialCounted(t, c, tt.cert, func(local string) { client.Store(local) })
			err := tt.call(conn)
			if got := status.Code(err); !tt.orClosed || got != codes.Unavailable {
				require.Equal(t, tt.want, got, "%v", err)
			}
			require.NoError(t, conn.Close())
			var cc *countingConn
			poll(t, func() bool {
				local, _ := client.Load().(string)
				cc = lis.conn(local)
				return cc != nil && cc.closed.Load()
			}, func() string { return "the controller never closed the connection" })
			read := cc.read.Load()
			t.Logf("%s: the controller read %d bytes", tt.name, read)
			if tt.read {
				if tt.want != codes.OK {
					require.Greater(t, read, int64(len(big)), "a verified client's request is read")
				}
				return
			}
			require.Less(t, read, int64(preauthReadBound), "read from an unverified client")
		})
	}
}

// dialCounted is dialRaw through a dialer that tells the connection's
// local address.
func dialCounted(t *testing.T, c *cluster, cert *pki.Issued, local func(string)) *grpc.ClientConn {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(c.ca.Cert)
	conf := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "127.0.0.1"}
	if cert != nil {
		conf.Certificates = []tls.Certificate{{Certificate: [][]byte{cert.Cert.Raw}, PrivateKey: cert.Key, Leaf: cert.Cert}}
	}
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(credentials.NewTLS(conf)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err == nil {
				local(conn.LocalAddr().String())
			}
			return conn, err
		}))
	require.NoError(t, err)
	return conn
}
