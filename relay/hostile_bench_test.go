package relay_test

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/rdzv/rdzv/internal/testaddr"
	"github.com/rdzv/rdzv/pki"
	"github.com/rdzv/rdzv/relay"
	"github.com/rdzv/rdzv/wire"
)

// BenchmarkHeaderFlood: 200 connections to a relay's agent port, each
// announcing a 16,000,000-byte frame and sending nothing more, without a
// certificate and with a valid agent's that has not registered. It
// reports the relay's live heap and the process's RSS (relay and
// attackers together) once the connections are in. Loopback; no
// controller (none is needed to reach the reads).
func BenchmarkHeaderFlood(b *testing.B) {
	dir := b.TempDir()
	ca, err := pki.NewCA("bench", time.Hour, time.Now())
	require.NoError(b, err)
	require.NoError(b, ca.Save(dir, false))
	issue := func(id pki.Identity, ips ...net.IP) pki.Files {
		is, err := ca.Issue(pki.Request{Identity: id, IPs: ips, ValidFor: time.Minute, Now: time.Now()})
		require.NoError(b, err)
		cert, key, err := is.Save(filepath.Join(dir, id.Name), false)
		require.NoError(b, err)
		return pki.Files{Cert: cert, Key: key, CA: filepath.Join(dir, pki.CACertFile)}
	}
	cfg := relay.DefaultConfig()
	cfg.Listen = testaddr.Free(b)
	cfg.Controller = testaddr.Free(b) // nothing listens
	cfg.HTTP.Listen = ""
	cfg.TLS = issue(pki.Identity{Role: pki.RoleRelay, Name: "rack-1"}, net.IPv4(127, 0, 0, 1))
	r, err := relay.New(cfg, zap.NewNop())
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	<-r.Ready()
	agent, err := tls.LoadX509KeyPair(issue(pki.Identity{Role: pki.RoleAgent, Name: "node-a"}).Cert, filepath.Join(dir, "node-a.key"))
	require.NoError(b, err)

	for _, tt := range []struct {
		name  string
		certs []tls.Certificate
	}{{"no certificate", nil}, {"agent not registered", []tls.Certificate{agent}}} {
		b.Run(strings.ReplaceAll(tt.name, " ", "_"), func(b *testing.B) {
			for range b.N {
				heap0, rss0 := memory(b)
				var conns []net.Conn
				for range 200 {
					c, err := tls.Dial("tcp", cfg.Listen, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13,
						NextProtos: []string{wire.AgentProtocol}, Certificates: tt.certs})
					if err != nil {
						continue // refused
					}
					_, _ = c.Write(binary.BigEndian.AppendUint32(nil, 16_000_000))
					conns = append(conns, c)
				}
				time.Sleep(time.Second) // the relay reads what it will
				heap1, rss1 := memory(b)
				b.ReportMetric(float64(heap0)/1e6, "heap0_MB")
				b.ReportMetric(float64(heap1)/1e6, "heap1_MB")
				b.ReportMetric(float64(rss0)/1e6, "rss0_MB")
				b.ReportMetric(float64(rss1)/1e6, "rss1_MB")
				for _, c := range conns {
					_ = c.Close()
				}
			}
		})
	}
}

// memory is the live heap after a collection, and the process's RSS.
func memory(b *testing.B) (heap, rss uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	status, err := os.ReadFile("/proc/self/status")
	require.NoError(b, err)
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(b, err)
			rss = kb << 10
		}
	}
	return ms.HeapAlloc, rss
}
