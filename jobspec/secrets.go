package jobspec

import (
	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Redacted stands in for a secret_env value wherever rdzv shows a job.
const Redacted = "<redacted>"

// RedactSpec returns p with every secret_env value replaced by Redacted,
// leaving p itself (the stored record) unchanged. env_files holds paths,
// not values, so it is shown as is.
func RedactSpec(p *rdzvv1.JobSpec) *rdzvv1.JobSpec {
	if len(p.GetSecretEnv()) == 0 {
		return p
	}
	r := proto.Clone(p).(*rdzvv1.JobSpec)
	for k := range r.SecretEnv {
		r.SecretEnv[k] = Redacted
	}
	return r
}
