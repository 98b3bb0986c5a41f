package controller_test

import (
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/pkg/v3/proxy"

	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/controller/keyring"
	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/internal/testetcd"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// newSlowEtcdCluster starts a cluster on an etcd behind a real TCP proxy,
// and returns it with etcd's own endpoint and hold: hold pauses the
// proxy's client-to-server direction, so that a transaction sent meanwhile
// is held in flight until release is called (or the test ends).
func newSlowEtcdCluster(t *testing.T) (c *cluster, endpoint string, hold func() (release func())) {
	t.Helper()
	endpoint, _ = testetcd.Start(t, "slow")
	target, err := url.Parse(endpoint)
	require.NoError(t, err)
	// The proxy listens on a Unix socket: given a port it would listen on
	// every address, where anything bound to that port on any loopback
	// address (another test's connection) takes it.
	front := filepath.Join(t.TempDir(), "etcd-proxy.sock")
	p := proxy.NewServer(proxy.ServerConfig{
		Logger: testLogger(t).Named("proxy"),
		From:   url.URL{Scheme: "unix", Host: front},
		To:     url.URL{Scheme: "tcp", Host: target.Host},
	})
	t.Cleanup(func() { _ = p.Close() })
	// The proxy reports a failed listen on Error and never becomes ready.
	select {
	case <-p.Ready():
	case err := <-p.Error():
		require.FailNow(t, "etcd proxy failed to start", "%v", err)
	case <-time.After(waitTimeout):
		require.FailNow(t, "etcd proxy never became ready")
	}

	keys := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, keyring.Create(keys, time.Now()))
	c = newCluster(t, func(cfg *controller.Config) {
		cfg.Etcd.Endpoints = []string{"unix://" + front}
		cfg.SecretsKeyFile = keys
		// The pause must not cost the lead or time the write out.
		cfg.LeaderLeaseTTL.Duration = time.Minute
		cfg.Etcd.RequestTimeout.Duration = time.Minute
		cfg.AdvertiseAddr = cfg.Listen
	})
	hold = func() func() {
		p.PauseTx()
		released := false
		release := func() {
			if !released {
				released = true
				p.UnpauseTx()
			}
		}
		t.Cleanup(release)
		return release
	}
	return c, endpoint, hold
}

// While an etcd write hangs, the controller still acknowledges heartbeats,
// takes agent reports and answers the API: no lock they need is held
// across etcd I/O. What depends on the write (the stop order for the
// failed generation) waits until it is durable.
func TestSlowEtcdWriteStallsNothingElse(t *testing.T) {
	c, endpoint, hold := newSlowEtcdCluster(t)
	direct, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = direct.Close() })

	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	c.startJob(c.recoverable("train", 2, 3))
	a1, b1 := a.run(), b.run()
	c.waitRunning("train")
	c.settle()

	unpause := hold()

	// A checkpoint report: its write is now held in flight.
	a.checkpoint(a1, 10, "/ckpt/train/step-10")
	c.waitJob("train", func(j *rdzvv1.Job) bool { return j.GetLatestCheckpoint().GetStep() == 10 })

	// Meanwhile everything else goes on.
	a.heartbeat(1)
	b.heartbeat(1)
	b.report(b1, rdzvv1.WorkerState_WORKER_STATE_FAILED, 1)
	j := c.waitJobState("train", recovering)
	require.Contains(t, j.GetReason(), "node node-b")
	require.Len(t, c.listNodes(), 2)
	a.heartbeat(2)

	// None of it reached etcd, and what rests on it was not sent: node-a
	// still runs generation 1 as far as it was told.
	resp, err := direct.Get(rpcCtx(t), store.CheckpointsPrefix("train"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Zero(t, resp.Count, "the checkpoint write was held, yet it landed")
	select {
	case m := <-a.msgs:
		require.FailNow(t, "a message that rests on a held write was sent", "%v", m)
	default:
	}

	unpause()
	a.expectStop(a1)
	resp, err = direct.Get(rpcCtx(t), store.CheckpointsPrefix("train"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.EqualValues(t, 1, resp.Count, "the held checkpoint write was lost")
	c.waitEvent("train", "attempt_failed")
}

// A restart decided while the failure before it is not durable yet (its
// write slow, the backoff short, every worker exited) is not stopped by
// that failure's stop order, which is for the failed generation alone: an
// agent told to stop a generation it has not started refuses it for good.
func TestSlowFailureWriteStopsNoNewerGeneration(t *testing.T) {
	c, _, hold := newSlowEtcdCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	c.startJob(c.recoverable("train", 1, 3))
	a1 := a.run()
	c.waitRunning("train")
	c.settle()

	release := hold()
	a.report(a1, rdzvv1.WorkerState_WORKER_STATE_FAILED, 1)
	c.waitJob("train", func(j *rdzvv1.Job) bool { return j.GetGeneration() == 2 })
	release()
	require.Equal(t, uint64(2), a.run().GetGeneration())
	c.settle()
	select {
	case m := <-a.msgs:
		require.FailNow(t, "unexpected message after the assignment", "%v", m)
	default:
	}
}
