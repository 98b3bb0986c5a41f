package controller_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rdzv/rdzv/controller"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Finished jobs beyond the kept count go with everything stored for them,
// events are capped per job and for the cluster, and etcd's history is
// compacted; running jobs are never touched.
func TestRetentionAndCompaction(t *testing.T) {
	c := newFakeClockCluster(t, func(cfg *controller.Config) {
		cfg.Retention.Interval.Duration = 200 * time.Millisecond
		cfg.Retention.MaxFinishedJobs = 1
		cfg.Retention.MaxJobEvents = 3
		cfg.Retention.MaxClusterEvents = 2
		cfg.Etcd.CompactionInterval.Duration = 300 * time.Millisecond
	})
	c.addAgent("node-a", 0, nil)
	c.addAgent("node-b", 0, nil)
	c.addAgent("node-c", 0, nil)
	firstRev := c.etcdRevision()

	c.startJob(c.spec("old", 1, 1, "ok"))
	c.waitJobState("old", succeeded)
	// Finish times must differ, and the controller's clock moves only when
	// advanced; so do its retention and compaction tickers.
	nodes := []string{"node-a", "node-b", "node-c"}
	c.advance(time.Millisecond, nodes...)
	c.startJob(c.spec("new", 1, 1, "ok"))
	c.waitJobState("new", succeeded)
	c.startJob(c.spec("running", 1, 1, "hang"))
	c.waitRunning("running")

	poll(t, func() bool {
		c.advance(100*time.Millisecond, nodes...)
		jobs := map[string]bool{}
		for _, j := range c.listJobs() {
			jobs[j.GetSpec().GetName()] = true
		}
		return !jobs["old"] && jobs["new"] && jobs["running"]
	}, func() string { return "the oldest finished job was not deleted" })
	for _, prefix := range []string{"/rdzv/v1/jobs/old", "/rdzv/v1/rounds/old/", "/rdzv/v1/workers/old/", "/rdzv/v1/events/old/"} {
		require.Empty(t, c.etcdKeys(prefix), prefix)
	}
	poll(t, func() bool {
		c.advance(100*time.Millisecond, nodes...)
		return len(c.events("new")) <= 3 && len(c.events("")) <= 2
	}, func() string { return "events were not capped" })
	require.Equal(t, rdzvv1.JobState_JOB_STATE_RUNNING, c.getJob("running").GetState())

	cli := c.etcdClient()
	poll(t, func() bool {
		c.advance(100*time.Millisecond, nodes...)
		_, err := cli.Get(rpcCtx(t), "/rdzv/v1/jobs/", clientv3.WithRev(firstRev))
		return err != nil && err.Error() == rpctypes.ErrCompacted.Error()
	}, func() string { return "etcd history was not compacted" })
}
