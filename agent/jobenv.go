package agent

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// jobEnv is the job's own environment for its workers: env, secret_env,
// and each env_files file read now, on this node. Errors name the variable
// and the file, never a value.
func (s *Supervisor) jobEnv(spec *rdzvv1.JobSpec) (map[string]string, error) {
	env := make(map[string]string, len(spec.GetEnv())+len(spec.GetSecretEnv())+len(spec.GetEnvFiles()))
	maps.Copy(env, spec.GetEnv())
	maps.Copy(env, spec.GetSecretEnv())
	for name, path := range spec.GetEnvFiles() {
		v, err := readSecretFile(s.secretsDir, path)
		if err != nil {
			return nil, fmt.Errorf("env_files.%s: %w", name, err)
		}
		env[name] = v
	}
	return env, nil
}

// readSecretFile reads one env_files value. The agent reads as root on
// behalf of a job that may run as anyone, so only files inside secretsDir
// (after following symlinks) may be read; one trailing newline, as editors
// and `echo` leave, is not part of the value.
func readSecretFile(secretsDir, path string) (string, error) {
	dir, err := filepath.EvalSymlinks(secretsDir)
	if err != nil {
		return "", fmt.Errorf("reading secrets directory: %w", err)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	if !wire.Within(dir, real) {
		return "", fmt.Errorf("%s is outside the agent's secrets_dir %s", path, secretsDir)
	}
	f, err := os.Open(real)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	if info, err := f.Stat(); err != nil || !info.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, wire.MaxEnvValueBytes+2))
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	b = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
	if len(b) > wire.MaxEnvValueBytes || bytes.IndexByte(b, 0) >= 0 {
		return "", fmt.Errorf("%s must hold at most %d bytes without NUL characters", path, wire.MaxEnvValueBytes)
	}
	return string(b), nil
}
