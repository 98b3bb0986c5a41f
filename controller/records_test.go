package controller_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/controller/store"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Records written straight into etcd, as by someone who got write access
// to it, are validated when a controller loads them: an invalid one is
// failed with the reason and never sent to an agent, and the rest of the
// cluster works on.
func TestHostileRecordsAreNotActedOn(t *testing.T) {
	c := newCluster(t)
	put := func(key string, m proto.Message) {
		t.Helper()
		b, err := proto.Marshal(m)
		require.NoError(t, err)
		_, err = c.etcdClient().Put(rpcCtx(t), key, string(b))
		require.NoError(t, err)
	}
	// Would run as is if it were loaded: only validation stops it.
	hostile := c.spec("evil", 1, 1, "ok")
	hostile.LauncherExtraArgs = []string{"--rdzv_endpoint", "10.6.6.6:29400"}
	put(store.JobKey("evil"), &rdzvv1.Job{Spec: hostile, State: rdzvv1.JobState_JOB_STATE_PENDING})
	// A valid spec under another job's key.
	put(store.JobKey("alias"), &rdzvv1.Job{Spec: c.spec("other-name", 1, 1, "ok"), State: rdzvv1.JobState_JOB_STATE_PENDING})
	// A running job whose round sends its workers to a master of the
	// writer's choosing.
	running := c.spec("hijack", 1, 1, "ok")
	put(store.JobKey("hijack"), &rdzvv1.Job{Spec: running, State: rdzvv1.JobState_JOB_STATE_RUNNING, Generation: 1})
	put(store.RoundKey("hijack", 1), &rdzvv1.Round{Job: "hijack", Generation: 1, MasterAddr: "attacker.example", MasterPort: 29500,
		Nodes: []*rdzvv1.NodeAssignment{{Node: "node-a", Address: "127.0.0.1"}}})
	// A node record that is not one.
	_, err := c.etcdClient().Put(rpcCtx(t), store.NodeKey("node-a"), "\xff\xff")
	require.NoError(t, err)

	c.stopController()
	c.startController()
	for name, want := range map[string]string{
		"evil":   "launcher.extra_args",
		"alias":  `spec.name: "other-name" is not the name in its key, "alias"`,
		"hijack": "round.master_addr",
	} {
		job := c.getJob(name)
		require.Equal(t, failed, job.GetState(), "job %s", name)
		require.Contains(t, job.GetReason(), store.JobKey(name), "job %s", name)
		require.Contains(t, job.GetReason(), want, "job %s", name)
		require.Empty(t, job.GetAssignments(), "job %s", name)
	}
	invalid := c.logs.FilterMessage("invalid job record in etcd, not acted on").All()
	require.Len(t, invalid, 3)
	require.Len(t, c.logs.FilterMessage("invalid node record in etcd, ignored until the node registers again").All(), 1)

	// The node's agent registers and rewrites its record; the cluster works
	// on, and none of the hostile jobs ever ran.
	c.addAgent("node-a", 0, nil)
	c.startJob(c.spec("ok", 1, 1, "ok"))
	c.waitJobState("ok", succeeded)
	for _, name := range []string{"evil", "alias", "other-name", "hijack"} {
		require.False(t, c.hasRecord(name, "node-a", 1), "job %s ran", name)
	}

	// Starting the job again replaces the record.
	c.startJob(c.spec("evil", 1, 1, "ok"))
	c.waitJobState("evil", succeeded)
}
