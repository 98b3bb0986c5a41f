package controller_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/rdzv/rdzv/controller"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// A job that a lost node shrank grows back once the node returns, right
// after its next complete checkpoint: one restart, resumed from that
// checkpoint, counted as no failure. Until that checkpoint, and with
// nodes.grow never at all, it keeps its width.
func TestGrowBackAtCheckpoint(t *testing.T) {
	for _, tt := range []struct {
		grow  string
		grows bool
	}{
		{jobspec.GrowCheckpoint, true},
		{jobspec.GrowNever, false},
	} {
		t.Run(tt.grow, func(t *testing.T) {
			c := newCluster(t)
			three := c.threeNodes("grow", func(s *rdzvv1.JobSpec) { s.NodesGrow = tt.grow })
			a, b, z, a1, b1 := three.agents[0], three.agents[1], three.agents[2], three.gen1[0], three.gen1[1]
			require.Equal(t, tt.grow, c.getJob("grow").GetSpec().GetNodesGrow())
			z.crash()
			c.waitJobState("grow", recovering)
			a.expectStop(a1)
			b.expectStop(b1)
			a2, b2 := a.run(), b.run()
			require.Equal(t, uint32(2), a2.GetNnodes())
			c.waitJob("grow", func(j *rdzvv1.Job) bool { return j.GetGeneration() == 2 && j.GetState() == running })

			// node-z is back and idle: the job keeps training on two until
			// it has a checkpoint to restart from.
			z = c.connectFake("node-z")
			z.keepAlive()
			c.waitIdle("node-z")
			a.step(a2, 5)
			c.schedulePass()
			require.EqualValues(t, 2, c.getJob("grow").GetGeneration())

			a.checkpoint(a2, 9, "/ckpt/grow/step-9")
			if !tt.grows {
				c.waitJob("grow", func(j *rdzvv1.Job) bool { return j.GetLatestCheckpoint().GetStep() == 9 })
				c.schedulePass()
				j := c.getJob("grow")
				require.Equal(t, running, j.GetState())
				require.EqualValues(t, 2, j.GetGeneration(), "nodes.grow never keeps the width")
				return
			}
			ev := c.waitEvent("grow", "job_growing")
			require.Contains(t, ev.GetMessage(), "from 2 to 3 nodes")
			require.Contains(t, ev.GetMessage(), "checkpoint step 9")
			a.expectStop(a2)
			b.expectStop(b2)
			a3, b3, z3 := a.run(), b.run(), z.run()
			for _, as := range []*rdzvv1.Assignment{a3, b3, z3} {
				require.EqualValues(t, 3, as.GetGeneration())
				require.Equal(t, uint32(3), as.GetNnodes())
				require.Equal(t, "/ckpt/grow/step-9", as.GetResumeFrom())
			}
			j := c.waitJob("grow", func(j *rdzvv1.Job) bool { return j.GetGeneration() == 3 && j.GetState() == running })
			require.EqualValues(t, 1, j.GetRestarts(), "a grow is no failure: only node-z's loss restarted the job")
			require.Len(t, j.GetIncidents(), 1)

			// At nodes.max a checkpoint changes nothing.
			a.checkpoint(a3, 12, "/ckpt/grow/step-12")
			c.waitJob("grow", func(j *rdzvv1.Job) bool { return j.GetLatestCheckpoint().GetStep() == 12 })
			c.schedulePass()
			require.EqualValues(t, 3, c.getJob("grow").GetGeneration())
		})
	}
}

// Idle nodes go to a job waiting for nodes before a running one grows.
// A job whose in-memory state is replicated grows back at an in-memory
// step, not only at a durable checkpoint: its grown generation resumes
// from memory whatever the world that saved the step. One whose state is
// not replicated waits for a durable checkpoint, as the grown world could
// not use its shards.
func TestGrowBackAtInMemoryStep(t *testing.T) {
	for _, replicated := range []bool{true, false} {
		t.Run(fmt.Sprintf("replicated=%t", replicated), func(t *testing.T) {
			c := newCluster(t)
			three := c.threeNodes("grow", func(s *rdzvv1.JobSpec) {
				s.NodesGrow = jobspec.GrowCheckpoint
				s.CheckpointMemory = &rdzvv1.CheckpointMemorySpec{Replicas: 1, MaxBytes: 1 << 30, Replicated: replicated}
			})
			a, b, z, a1, b1 := three.agents[0], three.agents[1], three.agents[2], three.gen1[0], three.gen1[1]
			z.crash()
			c.waitJobState("grow", recovering)
			a.expectStop(a1)
			b.expectStop(b1)
			a2, b2 := a.run(), b.run()
			c.waitJob("grow", func(j *rdzvv1.Job) bool { return j.GetGeneration() == 2 && j.GetState() == running })

			z = c.connectFake("node-z")
			z.keepAlive()
			c.waitIdle("node-z")
			a.saved(a2, 7, 0, 1)
			if !replicated {
				a.heartbeat(99) // acknowledged after the report before it
				c.schedulePass()
				require.EqualValues(t, 2, c.getJob("grow").GetGeneration(), "no grow before a durable checkpoint")
				return
			}
			ev := c.waitEvent("grow", "job_growing")
			require.Contains(t, ev.GetMessage(), "from 2 to 3 nodes")
			require.Contains(t, ev.GetMessage(), "resumes from the newest in-memory step")
			a.expectStop(a2)
			b.expectStop(b2)
			for _, f := range []*fakeAgent{a, b, z} {
				require.EqualValues(t, 3, f.run().GetGeneration())
			}
			j := c.waitJob("grow", func(j *rdzvv1.Job) bool { return j.GetGeneration() == 3 && j.GetState() == running })
			require.EqualValues(t, 1, j.GetRestarts(), "a grow is no failure")
			// These agents run no peer listener: both restarts fell back.
			m := scrape(t, c.httpAddr())
			require.Equal(t, 2.0, m.counter(t, "rdzv_resumes_total", "source", "durable"))
			require.Zero(t, m.counter(t, "rdzv_resumes_total", "source", "memory"))
		})
	}
}

func TestGrowYieldsToWaitingJob(t *testing.T) {
	c := newCluster(t)
	three := c.threeNodes("wide")
	a, b, z, a1, b1 := three.agents[0], three.agents[1], three.agents[2], three.gen1[0], three.gen1[1]
	z.crash()
	c.waitJobState("wide", recovering)
	a.expectStop(a1)
	b.expectStop(b1)
	a2, _ := a.run(), b.run()
	c.waitJob("wide", func(j *rdzvv1.Job) bool { return j.GetGeneration() == 2 && j.GetState() == running })

	c.startJob(c.spec("other", 2, 2, "ok"))
	z = c.connectFake("node-z")
	z.keepAlive()
	c.waitIdle("node-z")
	a.checkpoint(a2, 9, "/ckpt/wide/step-9")
	c.waitJob("wide", func(j *rdzvv1.Job) bool { return j.GetLatestCheckpoint().GetStep() == 9 })
	c.schedulePass()
	require.EqualValues(t, 2, c.getJob("wide").GetGeneration(), "a job waits for nodes: no grow")
	require.Equal(t, rdzvv1.JobState_JOB_STATE_PENDING, c.getJob("other").GetState())

	c.stopJob("other")
	c.waitJobState("other", rdzvv1.JobState_JOB_STATE_STOPPED)
	a.checkpoint(a2, 10, "/ckpt/wide/step-10")
	c.waitEvent("wide", "job_growing")
}

// schedulePass runs a scheduling pass and waits for what it wrote.
func (c *cluster) schedulePass() {
	c.t.Helper()
	controller.SchedulePass(context.Background(), c.ctl)
	c.settle()
}
