package client

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// FuzzFramedReader: whatever a relay sends, an agent's framed stream
// receives messages and then ends with a gRPC status (or io.EOF, the
// relay's OK), never anything else and never a panic.
func FuzzFramedReader(f *testing.F) {
	ca, err := pki.NewCA("fuzz", time.Hour, time.Now())
	require.NoError(f, err)
	leaf, err := ca.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleRelay, Name: "rack-1"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		ValidFor: time.Minute, Now: time.Now()})
	require.NoError(f, err)
	srvConf := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.Cert.Raw}, PrivateKey: leaf.Key}}}
	cliConf := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}

	reply, err := wire.AppendMessage(nil, &rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_HeartbeatAck{HeartbeatAck: &rdzvv1.HeartbeatAck{Seq: 3}}})
	require.NoError(f, err)
	f.Add(wire.AppendEnd(wire.AppendFrame(reply, wire.FramePong, nil), status.Error(codes.PermissionDenied, "no")))
	f.Add(wire.AppendEnd(nil, status.Error(codes.Unavailable, "held")))
	f.Add(wire.AppendEnd(nil, nil))
	f.Add(wire.AppendFrame(nil, 9, []byte("x")))
	f.Add([]byte{0, 0xf4, 0x24, 0, 1, 2})
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := net.Pipe()
		srv, cli := tls.Server(a, srvConf), tls.Client(b, cliConf)
		go func() {
			defer srv.Close()
			if srv.Handshake() != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, srv) }()
			_, _ = srv.Write(in)
		}()
		require.NoError(t, cli.Handshake())
		c := newConn(nil, nil, zap.NewNop())
		s := newFramedStream(context.Background(), c, "relay", cli)
		for {
			var m rdzvv1.ConnectResponse
			err := s.RecvMsg(&m)
			if err == nil {
				continue
			}
			if !errors.Is(err, io.EOF) {
				_, ok := status.FromError(err)
				require.True(t, ok, "not a status: %v", err)
			}
			break
		}
		c.mu.Lock()
		c.closeParked()
		c.mu.Unlock()
		_ = cli.Close()
	})
}
