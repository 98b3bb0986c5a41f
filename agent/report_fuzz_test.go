package agent

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
)

// FuzzReportEndpoint posts arbitrary bodies to the worker report endpoint:
// whatever arrives, the answer is a 2xx or 4xx naming the problem, never a
// panic or a 5xx.
func FuzzReportEndpoint(f *testing.F) {
	dir := f.TempDir()
	ckpt := filepath.Join(dir, "ckpt")
	if err := os.MkdirAll(filepath.Join(ckpt, "step-10"), 0o755); err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		`{"job":"train","generation":2,"step":40}`,
		`{"job":"train","generation":2,"step":10,"path":"` + filepath.Join(ckpt, "step-10") + `"}`,
		`{"job":"train","generation":2,"step":10,"path":"` + ckpt + `/../etc"}`,
		`{"job":"train","generation":1,"step":-1}`,
		`{"job":"../x","generation":2,"step":1}`,
		`{"job":"train","generation":18446744073709551615,"step":9223372036854775807}`,
		`{"step":1e400}`,
		`[1,2,3]`,
		``,
	} {
		f.Add(false, []byte(seed))
		f.Add(true, []byte(seed))
	}
	sup := NewSupervisor(Config{StateDir: dir, StopGrace: DefaultConfig().StopGrace}, "node-a", "lo", "", ExecSpawner{}, zap.NewNop())
	sup.cur = &worker{job: "train", generation: 2, checkpointDir: ckpt, reported: map[uint64]bool{}}
	handler := newReportHandler(sup, zap.NewNop(), time.Now)
	f.Fuzz(func(t *testing.T, checkpoint bool, body []byte) {
		path := "/v1/step"
		if checkpoint {
			path = "/v1/checkpoint"
		}
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
		switch rec.Code {
		case http.StatusNoContent, http.StatusBadRequest, http.StatusConflict, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body)
		}
		// Drain what a checkpoint report queued, as the session would.
		for len(sup.checkpoints) > 0 {
			<-sup.checkpoints
		}
	})
}
