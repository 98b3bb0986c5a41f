package controller

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// A summary of the largest job the limits allow (every summary field at its
// bound, 10,000 nodes) fits one message with a full page before it, which
// is what bounds a page of the job list.
func TestLargestJobSummaryFitsAfterAFullPage(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	spec := &rdzvv1.JobSpec{
		Name: long(63), NodesMin: wire.MaxNodes, NodesMax: wire.MaxNodes, GpusPerNode: wire.MaxGPUsPerNode, ProcsPerNode: wire.MaxProcsPerNode,
		Workdir: "/" + long(4095), CheckpointDir: "/" + long(4095), LauncherTorchrun: "/" + long(4095), RunAs: long(32),
		Selector: map[string]string{}, Env: map[string]string{"BIG": long(wire.MaxEnvValueBytes)},
		Command: []string{long(4096)}, LauncherExtraArgs: []string{long(4096)},
	}
	for i := range wire.MaxLabels {
		spec.Selector[fmt.Sprintf("%0253d", i)] = long(63)
	}
	for i := range 16 {
		spec.CheckpointMarkers = append(spec.CheckpointMarkers, fmt.Sprintf("%0255d", i))
	}
	job := &rdzvv1.Job{Spec: spec, State: rdzvv1.JobState_JOB_STATE_RUNNING, Reason: long(64 << 10), Generation: 1 << 62,
		MasterAddr: "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255", MasterPort: 65535,
		LatestCheckpoint: &rdzvv1.Checkpoint{Step: 1 << 62, Path: "/" + long(4095), Node: long(63), Source: "helper"}}
	gpus := make([]uint32, wire.MaxGPUsPerNode)
	for i := range gpus {
		gpus[i] = uint32(wire.MaxGPUsPerNode - 1)
	}
	for i := range wire.MaxNodes {
		job.Assignments = append(job.Assignments, &rdzvv1.NodeAssignment{
			Node: fmt.Sprintf("%063d", i), NodeRank: uint32(i), Address: "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255",
			NcclInterface: long(maxShortText), GpuIndices: gpus, State: rdzvv1.WorkerState_WORKER_STATE_FAILED,
			ExitCode: -1, Signal: long(maxShortText), Message: long(wire.MaxTextBytes),
		})
	}
	full := proto.Size(job)
	require.Greater(t, full, wire.MaxMessageBytes, "the full view of this job does not fit a message at all")
	summary := wire.ItemBytes(proto.Size(summarize(job)))
	require.Less(t, wire.MaxPageBytes+summary, wire.MaxMessageBytes-maxPageTokenBytes,
		"a page of summaries may not fit a message: %d bytes of page, %d of summary", wire.MaxPageBytes, summary)
	require.Empty(t, job.GetSpec().GetCommand())
	require.Empty(t, job.GetSpec().GetEnv())
	require.Empty(t, job.GetSpec().GetLauncherExtraArgs())
	require.Empty(t, job.GetAssignments()[0].GetMessage())
}

// Page tokens continue only the list that made them.
func TestPageTokens(t *testing.T) {
	tok := pageToken{List: eventsToken + "train", After: "00000000000000000001-000000000001", Left: 7}
	got, err := decodePageToken(tok.encode(), eventsToken+"train")
	require.NoError(t, err)
	require.Equal(t, tok, got)
	first, err := decodePageToken("", jobsToken)
	require.NoError(t, err)
	require.Equal(t, pageToken{}, first)
	for _, bad := range []struct {
		name, token, list string
	}{
		{"another list", tok.encode(), eventsToken + "other"},
		{"not base64", "!!", jobsToken},
		{"not json", "bm9wZQ", jobsToken},
		{"no position", pageToken{List: jobsToken}.encode(), jobsToken},
		{"negative count", pageToken{List: jobsToken, After: "a", Left: -1}.encode(), jobsToken},
		{"too long", strings.Repeat("A", maxPageTokenBytes+1), jobsToken},
	} {
		_, err := decodePageToken(bad.token, bad.list)
		require.ErrorContains(t, err, "page_token:", bad.name)
	}
}
