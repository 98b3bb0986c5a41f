// Package testetcd runs a real single-member etcd for tests, in a
// temporary directory on loopback ports.
package testetcd

import (
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/rdzv/rdzv/internal/testaddr"
)

// readyTimeout is generous: a loaded 2-core CI machine under -race can
// take many seconds to start etcd.
const readyTimeout = 60 * time.Second

// Start runs an etcd member named name until the test ends, or until stop
// is called (an etcd outage), and returns its client endpoint. opts adjust
// the member's configuration (a server flag under test).
func Start(t *testing.T, name string, opts ...func(*embed.Config)) (endpoint string, stop func()) {
	t.Helper()
	ec := embed.NewConfig()
	ec.Name = name
	ec.Dir = t.TempDir()
	client, peer := url.URL{Scheme: "http", Host: testaddr.Free(t)}, url.URL{Scheme: "http", Host: testaddr.Free(t)}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	// embed.NewConfig leaves this at zero, which logs every request as a
	// slow one; etcd's own command line defaults it the same way.
	ec.WarningUnaryRequestDuration = embed.DefaultWarningUnaryRequestDuration
	// etcd is chatty at info; warnings and errors still reach the test log.
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	for _, o := range opts {
		o(ec)
	}
	e, err := embed.StartEtcd(ec)
	require.NoError(t, err)
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			e.Close()
		}
	}
	t.Cleanup(stop)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		require.NoError(t, err, "embedded etcd failed")
	case <-time.After(readyTimeout):
		require.FailNow(t, "embedded etcd not ready after "+readyTimeout.String())
	}
	return client.String(), stop
}
