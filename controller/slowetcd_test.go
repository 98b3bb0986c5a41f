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
	"github.com/rdzv/rdzv/internal/testaddr"
	"github.com/rdzv/rdzv/internal/testetcd"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// While an etcd write hangs, the controller still acknowledges heartbeats,
// takes agent reports and answers the API: no lock they need is held
// across etcd I/O. What depends on the write (the stop order for the
// failed generation) waits until it is durable.
//
// etcd sits behind a real TCP proxy whose client-to-server direction is
// paused: a transaction sent meanwhile is held in flight.
func TestSlowEtcdWriteStallsNothingElse(t *testing.T) {
	endpoint, _ := testetcd.Start(t, "slow")
	target, err := url.Parse(endpoint)
	require.NoError(t, err)
	front := testaddr.Free(t)
	p := proxy.NewServer(proxy.ServerConfig{
		Logger: testLogger(t).Named("proxy"),
		From:   url.URL{Scheme: "tcp", Host: front},
		To:     url.URL{Scheme: "tcp", Host: target.Host},
	})
	<-p.Ready()
	t.Cleanup(func() { _ = p.Close() })

	keys := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, keyring.Create(keys, time.Now()))
	c := newCluster(t, func(cfg *controller.Config) {
		cfg.Etcd.Endpoints = []string{"http://" + front}
		cfg.SecretsKeyFile = keys
		// The pause must not cost the lead or time the write out.
		cfg.LeaderLeaseTTL.Duration = time.Minute
		cfg.Etcd.RequestTimeout.Duration = time.Minute
		cfg.AdvertiseAddr = cfg.Listen
	})
	direct, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = direct.Close() })

	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	c.startJob(c.recoverable("train", 2, 3))
	a1, b1 := a.run(), b.run()
	c.waitRunning("train")
	c.settle()

	p.PauseTx()
	unpaused := false
	unpause := func() {
		if !unpaused {
			unpaused = true
			p.UnpauseTx()
		}
	}
	t.Cleanup(unpause)

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
