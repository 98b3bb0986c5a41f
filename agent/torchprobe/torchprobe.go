// Package torchprobe reads, from a node's torch itself, what its torchrun
// is: the version, every option its parser accepts, the environment it
// gives each worker, and whether it needs --redirects/--tee to start its
// workers at all (torch 1.x on Python 3.11). The agent asks once per
// interpreter (its path and mtime), user and environment, and follows the
// answer: reserved options are refused in every spelling that parser
// accepts, and a warm standby gives its workers exactly that environment.
package torchprobe

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

//go:embed probe.py
var script []byte

// Timeout bounds one probe: it imports torch and runs a two-worker
// torchrun, on a node that may be busy.
const Timeout = 3 * time.Minute

// maxOutput bounds what is read of a probe's output: its JSON is a few KiB.
const maxOutput = 1 << 20

// Result is one interpreter's torch, as probe.py reports it.
type Result struct {
	Torch   string   `json:"torch"`
	Python  []int    `json:"python"`
	Options []Option `json:"options"`
	// StdBug is torch 1.x's Std.from_str on Python >= 3.11: torchrun dies
	// starting its workers unless --redirects and --tee are 1 or 2.
	StdBug bool `json:"std_bug"`
	// Env is what torchrun adds to a worker's environment (a one-node,
	// two-worker run with the static rendezvous, seen by local rank 1).
	Env map[string]string `json:"env"`
	// Module is torch's __init__.py: a cached answer is kept while it is
	// unchanged.
	Module string `json:"module"`
}

// PythonVersion is the interpreter's version, as "3.11.2".
func (r *Result) PythonVersion() string {
	parts := make([]string, len(r.Python))
	for i, n := range r.Python {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ".")
}

// Option is one of torchrun's options: its dest and every spelling.
type Option struct {
	Dest    string   `json:"dest"`
	Strings []string `json:"strings"`
	Flag    bool     `json:"flag"`
}

// Resolve is the option argparse reads arg as: an exact spelling, or an
// unambiguous prefix of a long one, with or without "=value". ok is false
// for no option or an ambiguous prefix (argparse refuses that itself);
// prefixes lists every option arg is a prefix of, so that a caller can
// refuse a spelling that could reach one it reserves.
func (r *Result) Resolve(arg string) (prefixes []Option) {
	if len(arg) < 2 || arg[0] != '-' || arg == "--" {
		return nil
	}
	name, _, _ := strings.Cut(arg, "=")
	for _, o := range r.Options {
		for _, s := range o.Strings {
			if s == name {
				return []Option{o}
			}
		}
	}
	if strings.HasPrefix(name, "--") {
		for _, o := range r.Options {
			if slices.ContainsFunc(o.Strings, func(s string) bool { return strings.HasPrefix(s, name) }) {
				prefixes = append(prefixes, o)
			}
		}
	} else if len(name) > 2 {
		// -rVALUE: a short option with its value attached.
		for _, o := range r.Options {
			if !o.Flag && slices.Contains(o.Strings, name[:2]) {
				return []Option{o}
			}
		}
	}
	return prefixes
}

// Run runs probe.py with python, as cred (nil: the agent's own user), in
// env. It is the real prober; tests of code that probes inject their own.
func Run(ctx context.Context, python string, env []string, cred *syscall.Credential) (*Result, error) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	// The script goes on stdin ("-"), so no file of the agent's needs to
	// be readable by the job's user.
	cmd := exec.CommandContext(ctx, python, "-")
	cmd.Stdin = bytes.NewReader(script)
	cmd.Env = env
	cmd.Dir = os.TempDir()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	// The probe's torchrun and its workers go with it.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out, errOut limitedBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("probing torch with %s: %w: %s", python, err, lastLine(errOut.String()))
	}
	var r Result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return nil, fmt.Errorf("probing torch with %s: reading its answer: %w", python, err)
	}
	if r.Torch == "" || len(r.Options) == 0 {
		return nil, fmt.Errorf("probing torch with %s: %w", python, errEmpty)
	}
	return &r, nil
}

// load is the answer kept on disk for key, or nil (none, unreadable, or
// its torch changed since).
func (c *Cache) load(key [sha256.Size]byte) *Result {
	if c.dir == "" {
		return nil
	}
	f, err := os.Open(c.path(key))
	if err != nil {
		return nil
	}
	defer f.Close()
	var st stored
	if err := json.NewDecoder(io.LimitReader(f, maxOutput)).Decode(&st); err != nil || st.Result == nil || st.Result.Module == "" {
		return nil
	}
	info, err := os.Stat(st.Result.Module)
	if err != nil || info.ModTime().UnixNano() != st.ModuleMtime {
		return nil
	}
	return st.Result
}

// store keeps r on disk for key, replacing the file whole; an answer that
// names no module of torch's is not kept (it could not be checked).
// Failing to write only costs a probe later.
func (c *Cache) store(key [sha256.Size]byte, r *Result) {
	if c.dir == "" || r.Module == "" {
		return
	}
	info, err := os.Stat(r.Module)
	if err != nil {
		return
	}
	data, err := json.Marshal(stored{Result: r, ModuleMtime: info.ModTime().UnixNano()})
	if err != nil || os.MkdirAll(c.dir, 0o700) != nil {
		return
	}
	tmp, err := os.CreateTemp(c.dir, ".probe-*")
	if err != nil {
		return
	}
	_, werr := tmp.Write(data)
	if cerr := tmp.Close(); werr != nil || cerr != nil || os.Rename(tmp.Name(), c.path(key)) != nil {
		os.Remove(tmp.Name())
	}
}

func (c *Cache) path(key [sha256.Size]byte) string {
	return filepath.Join(c.dir, hex.EncodeToString(key[:])+".json")
}

var errEmpty = errors.New("the answer names no torch version or no options")

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// limitedBuffer keeps the first maxOutput bytes written to it.
type limitedBuffer struct{ bytes.Buffer }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := maxOutput - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// Prober is how a Cache probes: Run, or a test's.
type Prober func(ctx context.Context, python string, env []string, cred *syscall.Credential) (*Result, error)

// Cache probes each interpreter once per its path and mtime (after
// symlinks), the user and the environment (PYTHONPATH and the like choose
// the torch). Concurrent asks for one key wait for one probe. Failures are
// cached too, in memory only: a probe that failed once fails again until
// the interpreter changes or the agent restarts. With a directory, answers
// are also kept on disk, one file per key, so that an agent's first job
// after a restart (or a node's first recovery) does not pay the probe's
// import torch again; a file is used only while torch's own __init__.py
// has the mtime it had when probed, so a torch upgraded in place under an
// unchanged interpreter is probed again. One lock guards the map; probes
// and file I/O run outside it.
type Cache struct {
	probe Prober
	dir   string
	mu    sync.Mutex
	m     map[[sha256.Size]byte]*entry
}

type entry struct {
	done chan struct{}
	r    *Result
	err  error
}

// stored is one answer on disk, with the mtime of its torch's module.
type stored struct {
	Result      *Result `json:"result"`
	ModuleMtime int64   `json:"module_mtime"`
}

// NewCache is a cache over probe that keeps its answers in dir too, or
// only in memory when dir is "". dir is created (0700) when first written.
func NewCache(probe Prober, dir string) *Cache {
	return &Cache{probe: probe, dir: dir, m: map[[sha256.Size]byte]*entry{}}
}

// Get probes python (an absolute path) or returns the cached answer.
func (c *Cache) Get(ctx context.Context, python string, env []string, cred *syscall.Credential) (*Result, error) {
	info, err := os.Stat(python)
	if err != nil {
		return nil, fmt.Errorf("probing torch: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%d\x00", python, info.ModTime().UnixNano())
	if cred != nil {
		fmt.Fprintf(h, "%d:%d\x00", cred.Uid, cred.Gid)
	}
	for _, kv := range env {
		fmt.Fprintf(h, "%s\x00", kv)
	}
	var key [sha256.Size]byte
	h.Sum(key[:0])
	c.mu.Lock()
	e, ok := c.m[key]
	if !ok {
		e = &entry{done: make(chan struct{})}
		c.m[key] = e
	}
	c.mu.Unlock()
	if !ok {
		if e.r = c.load(key); e.r == nil {
			e.r, e.err = c.probe(context.WithoutCancel(ctx), python, env, cred)
			if e.err == nil {
				c.store(key, e.r)
			}
		}
		close(e.done)
	}
	select {
	case <-e.done:
		return e.r, e.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
