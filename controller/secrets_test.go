package controller_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// A secret_env value reaches the workers, and is kept in etcd, but shows
// in no API response, event or log line of the controller or the agents.
func TestSecretsNeverShow(t *testing.T) {
	const secret = "hf_s3cret-value-123"
	c := newCluster(t)
	c.addAgent("node-a", 0, nil)

	spec := c.spec("secret", 1, 1, "ok")
	spec.SecretEnv = map[string]string{"JOB_SECRET": secret}
	var shown []proto.Message
	resp, err := c.jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: spec})
	require.NoError(t, err)
	shown = append(shown, resp)
	require.Equal(t, jobspec.Redacted, resp.GetJob().GetSpec().GetSecretEnv()["JOB_SECRET"])
	c.waitJobState("secret", succeeded)

	require.Equal(t, secret, c.record("secret", "node-a", 1).Env["JOB_SECRET"], "the worker gets the value")

	get, err := c.jobs.GetJob(rpcCtx(t), &rdzvv1.GetJobRequest{Name: "secret"})
	require.NoError(t, err)
	list, err := c.jobs.ListJobs(rpcCtx(t), &rdzvv1.ListJobsRequest{})
	require.NoError(t, err)
	stop, err := c.jobs.StopJob(rpcCtx(t), &rdzvv1.StopJobRequest{Name: "secret"})
	require.NoError(t, err)
	events, err := c.jobs.ListEvents(rpcCtx(t), &rdzvv1.ListEventsRequest{Job: "secret"})
	require.NoError(t, err)
	shown = append(shown, get, list, stop, events)
	require.Equal(t, jobspec.Redacted, get.GetJob().GetSpec().GetSecretEnv()["JOB_SECRET"])
	require.NotEmpty(t, events.GetEvents())
	for _, m := range shown {
		b, err := protojson.Marshal(m)
		require.NoError(t, err)
		require.NotContains(t, string(b), secret, "%T shows the secret", m)
	}

	require.NotZero(t, c.logs.Len())
	for _, e := range c.logs.All() {
		require.NotContains(t, fmt.Sprint(e.Message, e.ContextMap()), secret, "a log line shows the secret")
	}

	// Kept, not lost: the stored record is what agents are sent.
	kv, err := c.etcdClient().Get(rpcCtx(t), store.JobKey("secret"))
	require.NoError(t, err)
	require.Len(t, kv.Kvs, 1)
	require.True(t, strings.Contains(string(kv.Kvs[0].Value), secret), "the stored job lost its secret")
}
