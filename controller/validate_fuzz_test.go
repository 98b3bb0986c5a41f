package controller

import (
	"path"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/jobspec"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// The fuzz targets decode arbitrary bytes as each request type, as the gRPC
// server would, and run the validator. None may panic, and what it accepts
// must hold the properties the handlers rely on. Seeds are the table cases
// in validate_internal_test.go.

func seedCases[T proto.Message](f *testing.F, add func(*testing.F, T, []byte)) {
	for _, c := range validationCases {
		if m, ok := c.req.(T); ok {
			b, err := proto.Marshal(m)
			if err != nil {
				f.Fatal(err)
			}
			add(f, m, b)
		}
	}
}

func FuzzStartJobRequest(f *testing.F) {
	seedCases(f, func(f *testing.F, _ *rdzvv1.StartJobRequest, b []byte) { f.Add(b) })
	f.Fuzz(func(t *testing.T, data []byte) {
		var req rdzvv1.StartJobRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		if validateRequest(&req) != nil {
			return
		}
		// What is stored and sent to every agent: within the size etcd
		// takes, and still valid when an agent decodes it.
		spec := jobspec.FromProto(req.GetSpec())
		if n := proto.Size(spec.ToProto()); n > wire.MaxSpecBytes {
			t.Fatalf("accepted a spec of %d bytes", n)
		}
		if err := jobspec.FromProto(spec.ToProto()).Validate(); err != nil {
			t.Fatalf("accepted spec fails validation once stored: %v", err)
		}
	})
}

// requestKinds are the operator requests FuzzRequests picks from.
var requestKinds = []func() proto.Message{
	func() proto.Message { return &rdzvv1.GetJobRequest{} },
	func() proto.Message { return &rdzvv1.StopJobRequest{} },
	func() proto.Message { return &rdzvv1.ListJobsRequest{} },
	func() proto.Message { return &rdzvv1.ListEventsRequest{} },
	func() proto.Message { return &rdzvv1.StreamLogsRequest{} },
	func() proto.Message { return &rdzvv1.ListNodesRequest{} },
	func() proto.Message { return &rdzvv1.CordonNodeRequest{} },
	func() proto.Message { return &rdzvv1.UncordonNodeRequest{} },
	func() proto.Message { return &rdzvv1.DeleteJobRequest{} },
	func() proto.Message { return &rdzvv1.RevokeCertificateRequest{} },
	func() proto.Message { return &rdzvv1.ListRevocationsRequest{} },
}

func FuzzRequests(f *testing.F) {
	for _, c := range validationCases {
		for kind, mk := range requestKinds {
			if m, ok := c.req.(proto.Message); ok && proto.MessageName(m) == proto.MessageName(mk()) {
				b, err := proto.Marshal(m)
				if err != nil {
					f.Fatal(err)
				}
				f.Add(uint8(kind), b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, data []byte) {
		req := requestKinds[int(kind)%len(requestKinds)]()
		if proto.Unmarshal(data, req) != nil {
			return
		}
		if validateRequest(req) != nil {
			return
		}
		// Accepted names become etcd keys and, on the nodes, file names: they
		// must never lead out of a directory.
		var names []string
		switch r := req.(type) {
		case *rdzvv1.GetJobRequest:
			names = []string{r.GetName()}
		case *rdzvv1.StopJobRequest:
			names = []string{r.GetName()}
		case *rdzvv1.DeleteJobRequest:
			names = []string{r.GetName()}
		case *rdzvv1.ListJobsRequest:
			if r.GetPageSize() < 0 || len(r.GetStates()) > maxStateFilters {
				t.Fatalf("accepted page_size %d, %d states", r.GetPageSize(), len(r.GetStates()))
			}
		case *rdzvv1.ListNodesRequest:
			if r.GetPageSize() < 0 || len(r.GetSelector()) > wire.MaxLabels {
				t.Fatalf("accepted page_size %d, %d selector labels", r.GetPageSize(), len(r.GetSelector()))
			}
		case *rdzvv1.ListEventsRequest:
			names = []string{r.GetJob()}
			if r.GetLimit() > maxEventLimit || r.GetPageSize() < 0 {
				t.Fatalf("accepted limit %d, page_size %d", r.GetLimit(), r.GetPageSize())
			}
		case *rdzvv1.StreamLogsRequest:
			names = []string{r.GetJob(), r.GetNode()}
			if r.GetTailBytes() > wire.MaxLogTailBytes {
				t.Fatalf("accepted tail_bytes %d", r.GetTailBytes())
			}
		case *rdzvv1.CordonNodeRequest:
			names = []string{r.GetName()}
			if len(r.GetReason()) > maxReasonBytes {
				t.Fatalf("accepted a reason of %d bytes", len(r.GetReason()))
			}
		case *rdzvv1.UncordonNodeRequest:
			names = []string{r.GetName()}
		case *rdzvv1.RevokeCertificateRequest:
			// What the controller stores for it: one key right under the
			// deny-list's prefix.
			entry := &rdzvv1.Revocation{Target: &rdzvv1.Revocation_Identity{Identity: r.GetIdentity()}}
			if r.GetSerial() != "" {
				serial, err := pki.ParseSerial(r.GetSerial())
				if err != nil {
					t.Fatalf("accepted serial %q does not parse: %v", r.GetSerial(), err)
				}
				entry.Target = &rdzvv1.Revocation_Serial{Serial: serial}
			}
			if err := validateRevocation(&rdzvv1.Revocation{Target: entry.Target, IssuedBefore: timestamppb.Now(), NotAfter: timestamppb.Now()}); err != nil {
				t.Fatalf("accepted request makes an invalid entry: %v", err)
			}
			key := store.RevocationKey(entry)
			if rest, ok := strings.CutPrefix(key, store.RevokedPrefix()); !ok || path.Clean(key) != key || strings.Contains(rest, "..") {
				t.Fatalf("accepted request is stored at %q", key)
			}
		}
		for _, n := range names {
			if n == "" {
				continue
			}
			if p := filepath.Join("/state/logs", n+".log"); filepath.Dir(p) != "/state/logs" {
				t.Fatalf("accepted name %q leads to %s", n, p)
			}
		}
	})
}

func FuzzConnectRequest(f *testing.F) {
	seedCases(f, func(f *testing.F, _ *rdzvv1.ConnectRequest, b []byte) { f.Add(b) })
	f.Fuzz(func(t *testing.T, data []byte) {
		var m rdzvv1.ConnectRequest
		if proto.Unmarshal(data, &m) != nil {
			return
		}
		if validateRequest(&m) != nil {
			return
		}
		// The job's checkpoint directory is checked when the report is
		// applied; together the two keep a path inside it.
		if c := m.GetCheckpoint(); c != nil && checkpointPathOK("/ckpt", c.GetPath()) == nil && !strings.HasPrefix(c.GetPath(), "/ckpt/") {
			t.Fatalf("accepted checkpoint path %q outside /ckpt", c.GetPath())
		}
		// applyWorkerStatus tells alive from ended by the known states only.
		if w := m.GetWorkerStatus(); w != nil {
			if _, known := rdzvv1.WorkerState_name[int32(w.GetState())]; !known || w.GetState() == rdzvv1.WorkerState_WORKER_STATE_UNSPECIFIED {
				t.Fatalf("accepted worker state %d", w.GetState())
			}
		}
	})
}
