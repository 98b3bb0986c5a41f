package controller

import rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"

// withMembers gives js round and workers, as a commit or a load does.
func withMembers(js *jobState, round *rdzvv1.Round, workers map[string]*rdzvv1.WorkerStatus) *jobState {
	js.members.Reset(round, workers)
	return js
}
