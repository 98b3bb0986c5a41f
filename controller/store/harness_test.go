package store

import (
	"context"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// A closed embedded etcd and client leave no goroutines behind, so no
// ignore options are needed here.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startEtcd runs a single-member etcd in a temporary directory for the
// duration of the test and returns a client to it.
func startEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	ec := embed.NewConfig()
	ec.Name = "store-test"
	ec.Dir = t.TempDir()
	client, peer := localURL(t), localURL(t)
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	// embed.NewConfig leaves this at zero, which logs every request as a
	// slow one; etcd's own command line defaults it the same way.
	ec.WarningUnaryRequestDuration = embed.DefaultWarningUnaryRequestDuration
	// etcd is chatty at info; warnings and errors still reach the test log.
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))

	e, err := embed.StartEtcd(ec)
	require.NoError(t, err)
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		require.NoError(t, err, "embedded etcd failed")
	case <-time.After(60 * time.Second):
		require.FailNow(t, "embedded etcd not ready after 60s")
	}

	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{client.String()},
		DialTimeout: 5 * time.Second,
		Logger:      zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// localURL is an http URL on a loopback port that was free a moment ago.
func localURL(t *testing.T) url.URL {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return url.URL{Scheme: "http", Host: addr}
}

// newStore is a Store over a fresh etcd that leads (see lead), and the raw
// client for checking what was (not) written.
func newStore(t *testing.T) (*Store, *clientv3.Client) {
	cli := startEtcd(t)
	s := New(cli, 0)
	s.Lead(lead(t, cli, "test"))
	return s, cli
}

// lead creates a key standing in for a won election's (outside the real
// election, which it would otherwise block) and returns the leadership it
// stands for.
func lead(t *testing.T, cli *clientv3.Client, name string) Leadership {
	t.Helper()
	key := Prefix + "test-leader/" + name
	resp, err := cli.Put(ctx(t), key, name)
	require.NoError(t, err)
	return Leadership{Key: key, Rev: resp.Header.Revision}
}

// ctx bounds each test's etcd calls so a wedged server fails the test
// instead of hanging it.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// revision is etcd's current store revision: it moves on every write.
func revision(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(ctx(t), "rdzv-test-probe")
	require.NoError(t, err)
	return resp.Header.Revision
}

// keys lists every key under prefix, for asserting what a write left behind.
func keys(t *testing.T, cli *clientv3.Client, prefix string) []string {
	t.Helper()
	resp, err := cli.Get(ctx(t), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	out := make([]string, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		out[i] = string(kv.Key)
	}
	return out
}
