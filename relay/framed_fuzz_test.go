package relay

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// FuzzFramedReader: whatever bytes an agent's connection carries, the
// relay's reader (agentConn.read) returns once they end, with every
// goroutine it started done, and never panics. The connection has no
// certificate, so every register it sends is refused at its open, and no
// call to a controller is needed.
func FuzzFramedReader(f *testing.F) {
	cfg := DefaultConfig()
	cfg.Controller, cfg.HTTP.Listen, cfg.TLS = "127.0.0.1:1", "", relayFiles(f)
	r, err := New(cfg, zap.NewNop())
	require.NoError(f, err)

	reg, err := wire.AppendMessage(nil, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: &rdzvv1.NodeInfo{Name: "node-a"}}}})
	require.NoError(f, err)
	hb, err := wire.AppendMessage(nil, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: 1}}})
	require.NoError(f, err)
	f.Add(append(wire.AppendFrame(nil, wire.FramePing, nil), reg...))
	f.Add(append(hb, reg...))
	f.Add(wire.AppendFrame(nil, wire.FrameMessage, []byte{0xff}))
	f.Add(wire.AppendEnd(nil, status.Error(codes.Internal, "x")))
	f.Add([]byte{0, 0xf4, 0x24, 0, 1})
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := net.Pipe()
		go func() { _, _ = io.Copy(io.Discard, b) }()
		go func() {
			_, _ = b.Write(in)
			_ = b.Close()
		}()
		ac := newAgentConn(context.Background(), r, a, nil)
		ac.unwatch = func() bool { return true }
		ac.read()
		r.conns.Wait()
	})
}

// relayFiles are a relay's TLS files, of a CA of their own.
func relayFiles(tb testing.TB) pki.Files {
	dir := tb.TempDir()
	ca, err := pki.NewCA("test", time.Hour, time.Now())
	require.NoError(tb, err)
	require.NoError(tb, ca.Save(dir, false))
	own, err := ca.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleRelay, Name: "rack-1"}, ValidFor: time.Minute, Now: time.Now()})
	require.NoError(tb, err)
	cert, key, err := own.Save(filepath.Join(dir, "relay"), false)
	require.NoError(tb, err)
	return pki.Files{Cert: cert, Key: key, CA: filepath.Join(dir, pki.CACertFile)}
}

// Refusals are all counted, and logged a few lines a second at most.
func TestRefusalsRateLimited(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	cfg := DefaultConfig()
	cfg.Controller, cfg.HTTP.Listen, cfg.TLS = "127.0.0.1:1", "", relayFiles(t)
	r, err := New(cfg, zap.New(core))
	require.NoError(t, err)
	for range 2000 {
		r.refused(refusedHandshake, "127.0.0.1:1", pki.ErrNoCertificate)
	}
	require.Equal(t, float64(2000), testutil.ToFloat64(r.metrics.refused.WithLabelValues(refusedHandshake)))
	require.LessOrEqual(t, logs.FilterMessage("agent refused").Len(), 2*refusalLines, "a second or two of lines")
}
