package agent

import (
	"bytes"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/wire"
)

// FuzzReportEndpoint posts arbitrary bodies with arbitrary Authorization
// headers to the worker report endpoint: whatever arrives, the answer is a
// 2xx or 4xx naming the problem, never a panic or a 5xx, and nothing but
// the running workers' token gets past 401 or 403. Whatever a step report
// leaves for the controller stays within the metrics' bounds.
func FuzzReportEndpoint(f *testing.F) {
	dir := f.TempDir()
	ckpt := filepath.Join(dir, "ckpt")
	if err := os.MkdirAll(filepath.Join(ckpt, "step-10"), 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink("/root", filepath.Join(ckpt, "step-11")); err != nil {
		f.Fatal(err)
	}
	token := bytes.Repeat([]byte{0x5a}, reportTokenBytes)
	valid := "Bearer " + hex.EncodeToString(token)
	for _, seed := range []string{
		`{"job":"train","generation":2,"step":40}`,
		`{"job":"train","generation":2,"step":40,"phase":"saving","metrics":{"loss":2.5,"lr":"NaN","x/y":-1e308}}`,
		`{"job":"train","generation":2,"step":41,"phase":"done","metrics":{"loss":"Infinity"}}`,
		`{"job":"train","generation":2,"step":41,"phase":"eval","metrics":{"":1,"a b":{},"c":[1],"d":null,"e":1e999}}`,
		`{"job":"train","generation":2,"step":10,"phase":"saving","path":"` + filepath.Join(ckpt, "step-10") + `"}`,
		`{"job":"train","generation":2,"step":10,"path":"` + filepath.Join(ckpt, "step-10") + `"}`,
		`{"job":"train","generation":2,"step":11,"path":"` + filepath.Join(ckpt, "step-11") + `"}`,
		`{"job":"train","generation":2,"step":10,"path":"` + ckpt + `/../etc"}`,
		`{"job":"train","generation":1,"step":-1}`,
		`{"job":"../x","generation":2,"step":1}`,
		`{"job":"train","generation":18446744073709551615,"step":9223372036854775807}`,
		`{"step":1e400}`,
		`[1,2,3]`,
		``,
	} {
		for _, auth := range []string{valid, "", "Bearer", "Bearer ", "bearer " + strings.ToUpper(hex.EncodeToString(token)),
			valid + "0", valid[:len(valid)-1], "Bearer  " + hex.EncodeToString(token), "Basic dXNlcjpwYXNz", "Bearer " + strings.Repeat("0", 64)} {
			f.Add(false, auth, []byte(seed))
			f.Add(true, auth, []byte(seed))
		}
	}
	sup := NewSupervisor(Config{StateDir: dir, StopGrace: DefaultConfig().StopGrace}, "node-a", "lo", "", ExecSpawner{}, zap.NewNop())
	sup.cur = &worker{job: "train", generation: 2, checkpointDir: ckpt, token: token, reported: map[uint64]bool{}}
	sup.publish()
	handler := newReportHandler(sup, zap.NewNop(), time.Now)
	f.Fuzz(func(t *testing.T, checkpoint bool, auth string, body []byte) {
		path := "/v1/step"
		if checkpoint {
			path = "/v1/checkpoint"
		}
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusNoContent, http.StatusBadRequest, http.StatusConflict, http.StatusRequestEntityTooLarge,
			http.StatusUnauthorized, http.StatusForbidden:
		default:
			t.Fatalf("status %d for %q, %q: %s", rec.Code, auth, body, rec.Body)
		}
		// The token's hex may be in either case; the scheme too.
		authorized := len(auth) == len(valid) && strings.EqualFold(auth, valid)
		if refused := rec.Code == http.StatusUnauthorized || rec.Code == http.StatusForbidden; refused == authorized {
			t.Fatalf("status %d for Authorization %q (the token's: %v): %s", rec.Code, auth, authorized, rec.Body)
		}
		if p := sup.Progress(); p != nil && len(p.GetMetrics()) > wire.MaxMetrics {
			t.Fatalf("%d metrics kept from %q", len(p.GetMetrics()), body)
		}
		// Drain what a checkpoint report queued, as the session would.
		for len(sup.checkpoints) > 0 {
			<-sup.checkpoints
		}
	})
}
