// Package launchertest helps tests stand in for torchrun with a shell
// script: a preamble that records how the script was launched, and the
// reader of that record. The agent's and the controller's tests share it.
package launchertest

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Preamble is shell that writes the record to the file named by $rec: the
// script's pid, each argument, and the environment variables whose names
// match envPattern (an extended regular expression). It writes a temporary
// file first and renames it, so a reader never sees half a record.
func Preamble(envPattern string) string {
	return fmt.Sprintf(`{
	echo "pid=$$"
	for a in "$@"; do echo "arg=$a"; done
	env | grep -E '^(%s)=' | sed 's/^/env=/'
} >"$rec.tmp"
mv "$rec.tmp" "$rec"
`, envPattern)
}

// Record is how a stand-in launcher was started.
type Record struct {
	PID  int
	Args []string
	Env  map[string]string
}

// Arg returns the value following a launcher flag, or "".
func (r Record) Arg(flag string) string {
	for i, a := range r.Args {
		if a == flag && i+1 < len(r.Args) {
			return r.Args[i+1]
		}
	}
	return ""
}

// Read parses a record written by Preamble.
func Read(path string) (Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return Record{}, fmt.Errorf("reading launcher record: %w", err)
	}
	defer f.Close()
	r := Record{Env: map[string]string{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, value, _ := strings.Cut(sc.Text(), "=")
		switch key {
		case "pid":
			if r.PID, err = strconv.Atoi(value); err != nil {
				return Record{}, fmt.Errorf("launcher record %s: pid %q: %w", path, value, err)
			}
		case "arg":
			r.Args = append(r.Args, value)
		case "env":
			k, v, _ := strings.Cut(value, "=")
			r.Env[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		return Record{}, fmt.Errorf("reading launcher record %s: %w", path, err)
	}
	return r, nil
}
