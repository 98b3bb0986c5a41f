package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/controller/keyring"
	"github.com/rdzv/rdzv/internal/testetcd"
)

// A closed embedded etcd and client leave no goroutines behind, so no
// ignore options are needed here.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startEtcd runs a single-member etcd for the duration of the test and
// returns a client to it.
func startEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	endpoint, _ := testetcd.Start(t, "store-test")
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// newStore is a Store over a fresh etcd that leads (see lead), and the raw
// client for checking what was (not) written.
func newStore(t *testing.T) (*Store, *clientv3.Client) {
	cli := startEtcd(t)
	s := New(cli, 0, testKeys(t), 0)
	s.Lead(lead(t, cli, "test"))
	return s, cli
}

// testKeys is a keyring with one fresh key, for sealing secrets.
func testKeys(t *testing.T) *keyring.Keyring {
	t.Helper()
	k, _, err := keyring.LoadOrCreate(filepath.Join(t.TempDir(), "secrets.key"), true, time.Now())
	require.NoError(t, err)
	return k
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

// commit writes changes in order, in as many transactions as they take, and
// returns the revision of the last.
func commit(t *testing.T, s *Store, changes ...*Change) int64 {
	t.Helper()
	rev, err := s.CommitAll(ctx(t), changes...)
	require.NoError(t, err)
	return rev
}

// sibling is a second Store over s's etcd that leads as s does but has seen
// none of its records: a controller whose view is stale or empty, which is
// what the implicit guards protect against.
func sibling(s *Store) *Store {
	o := New(s.Client(), 0, s.keys, s.maxTxnOps)
	o.Lead(*s.lead.Load())
	return o
}

// putBehind writes value at key with the raw client, behind the store's
// back, so that the store's guard on that key is stale.
func putBehind(t *testing.T, cli *clientv3.Client, key string, value proto.Message) {
	t.Helper()
	b, err := proto.Marshal(value)
	require.NoError(t, err)
	_, err = cli.Put(ctx(t), key, string(b))
	require.NoError(t, err)
}
