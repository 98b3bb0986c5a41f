package jobspec

import (
	"os"
	"testing"

	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// FuzzParse feeds arbitrary job files to the parser and validator: neither
// may panic, and a spec they accept must survive the trip over the wire
// (rdzvctl sends it as proto, the controller and agents validate it again).
func FuzzParse(f *testing.F) {
	example, err := os.ReadFile("../examples/job.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		string(example), goodJob,
		"name: a\nnodes: {min: 1}\ncommand: [x.py]\nrestart: {max_restarts: 0}\n",
		"name: a\nnodes: {min: 1}\ncommand: [x]\nsecret_env: {TOKEN: abc}\nenv_files: {KEY: /etc/key}\nrun_as: \"65534:65534\"\n",
		"name: a\nnodes: {min: 1}\ncommand: [x]\nnodez: 3\n",
		"name: a\nnodes: {min: two}\ncommand: [x]\n",
		"name: a\nnodes: {min: 1}\ncommand: [x]\nrendezvous: {last_call: 10}\n",
		"name: [unclosed\n",
		"a: &a [*a, *a]\n",
		"name: ../../etc\nnodes: {min: 1}\ncommand: [x]\nworkdir: /a/../b\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := Parse(data)
		if err != nil {
			return
		}
		if spec.Validate() != nil {
			return
		}
		msg := spec.ToProto()
		if n := proto.Size(msg); n > wire.MaxSpecBytes {
			t.Fatalf("accepted a spec of %d bytes", n)
		}
		b, err := proto.Marshal(msg)
		if err != nil {
			t.Fatalf("accepted spec does not marshal: %v", err)
		}
		var got rdzvv1.JobSpec
		if err := proto.Unmarshal(b, &got); err != nil {
			t.Fatalf("accepted spec does not unmarshal: %v", err)
		}
		back := FromProto(&got)
		if err := back.Validate(); err != nil {
			t.Fatalf("accepted spec fails validation after the round trip: %v", err)
		}
		if !proto.Equal(msg, back.ToProto()) {
			t.Fatalf("round trip changed the spec:\n%v\n%v", msg, back.ToProto())
		}
	})
}
