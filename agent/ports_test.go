package agent

import (
	"math/rand/v2"
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// heldPort listens on a port the way torchrun's store would, on every
// address, and returns it.
func heldPort(t *testing.T) uint32 {
	t.Helper()
	l, err := net.Listen("tcp", ":0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return uint32(l.Addr().(*net.TCPAddr).Port)
}

// freePort is a port that was free a moment ago, below Linux's ephemeral
// range (32768 and up): there the kernel hands ports to other tests'
// connections at any moment, and one could take it before the probe.
func freePort(t *testing.T) uint32 {
	t.Helper()
	for range 100 {
		port := uint32(20000 + rand.N(10000))
		if l, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(int(port)))); err == nil {
			require.NoError(t, l.Close())
			return port
		}
	}
	require.FailNow(t, "no free port below the ephemeral range")
	return 0
}

func TestProbePort(t *testing.T) {
	held := heldPort(t)
	free := freePort(t)
	tests := []struct {
		name     string
		min, max uint32
		// want is the only acceptable port; zero accepts any in range.
		want    uint32
		wantErr string
	}{
		{name: "wide range", min: 40000, max: 49999},
		{name: "single free port", min: free, max: free, want: free},
		{name: "single held port", min: held, max: held, wantErr: "no free port: tried 1 ports"},
		{name: "min above max", min: 30000, max: 29999, wantErr: "invalid port range 30000-29999"},
		{name: "port zero", min: 0, max: 10, wantErr: "invalid port range 0-10"},
		{name: "beyond 65535", min: 65000, max: 70000, wantErr: "invalid port range 65000-70000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := probePort(&rdzvv1.PortProbe{RequestId: "req-1", PortMin: tt.min, PortMax: tt.max})
			require.Equal(t, "req-1", res.GetRequestId())
			if tt.wantErr != "" {
				require.Contains(t, res.GetError(), tt.wantErr)
				require.Zero(t, res.GetPort())
				return
			}
			require.Empty(t, res.GetError())
			require.GreaterOrEqual(t, res.GetPort(), tt.min)
			require.LessOrEqual(t, res.GetPort(), tt.max)
			if tt.want != 0 {
				require.Equal(t, tt.want, res.GetPort())
			}
			// The probe let go of the port for torchrun to take.
			l, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(int(res.GetPort()))))
			require.NoError(t, err)
			require.NoError(t, l.Close())
		})
	}
}

// TestProbePortSkipsHeldPorts holds all but the last port of a small range:
// the probe must find the free one rather than give up on a refusal.
func TestProbePortSkipsHeldPorts(t *testing.T) {
	const span = 8
	for attempt := 0; attempt < 20; attempt++ {
		base, held, ok := freePort(t), []net.Listener(nil), true
		for p := base; p < base+span && ok; p++ {
			l, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(int(p))))
			if ok = err == nil; ok {
				held = append(held, l)
			}
		}
		if ok {
			// The last port was free a moment ago; let go of it for the
			// probe to find.
			require.NoError(t, held[span-1].Close())
			held = held[:span-1]
			res := probePort(&rdzvv1.PortProbe{PortMin: base, PortMax: base + span - 1})
			require.Empty(t, res.GetError())
			require.Equal(t, base+span-1, res.GetPort())
		}
		for _, l := range held {
			require.NoError(t, l.Close())
		}
		if ok {
			return
		}
	}
	require.FailNow(t, "never found a run of free ports to hold")
}
