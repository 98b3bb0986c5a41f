package cli

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
)

type fakeDaemon struct{ ready chan struct{} }

func (fakeDaemon) Run(context.Context) error { return nil }
func (d fakeDaemon) Ready() <-chan struct{}  { return d.ready }

type plainDaemon struct{}

func (plainDaemon) Run(context.Context) error { return nil }

// listenNotify is a stand-in for systemd's notification socket.
func listenNotify(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return conn
}

func readNotification(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	// Only keeps a broken test from hanging.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	buf := make([]byte, 256)
	n, err := conn.Read(buf)
	require.NoError(t, err)
	return string(buf[:n])
}

// runNotify runs notify for d until the returned stop is called.
func runNotify(t *testing.T, d Daemon) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		notify(ctx, zaptest.NewLogger(t), d)
	}()
	return func() {
		cancel()
		<-done
	}
}

// systemd hears READY=1 once the daemon is ready, then STOPPING=1 when it
// is told to stop, in that order.
func TestNotifyReadyThenStopping(t *testing.T) {
	defer goleak.VerifyNone(t)
	conn := listenNotify(t)
	d := fakeDaemon{ready: make(chan struct{})}
	stop := runNotify(t, d)
	close(d.ready)
	require.Equal(t, "READY=1", readNotification(t, conn))
	stop()
	require.Equal(t, "STOPPING=1", readNotification(t, conn))
}

// A daemon that stops before it is ready, or cannot say, is never
// announced ready.
func TestNotifyNeverReady(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, d := range []Daemon{fakeDaemon{ready: make(chan struct{})}, plainDaemon{}} {
		conn := listenNotify(t)
		runNotify(t, d)()
		require.Equal(t, "STOPPING=1", readNotification(t, conn))
	}
}

// Each systemd unit stops restarting its daemon at a bad configuration,
// which every restart would meet again.
func TestUnitsPreventRestartOnBadConfig(t *testing.T) {
	for _, unit := range []string{"rdzv-agent.service", "rdzv-controller.service", "rdzv-relay.service"} {
		t.Run(unit, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "systemd", unit))
			require.NoError(t, err)
			require.Contains(t, strings.Split(string(data), "\n"), fmt.Sprintf("RestartPreventExitStatus=%d", ExitConfig))
		})
	}
}
