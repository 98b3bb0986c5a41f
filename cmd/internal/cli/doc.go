package cli

import (
	"fmt"
	"os"
	"strings"
)

// DaemonsDoc is the generated flag reference of the daemons. Each daemon's
// section lies between its markers and is its --help, so the reference
// cannot drift from the flags: each daemon's tests compare the two, and
// `make docs` (go test ... -update) rewrites the section.
const DaemonsDoc = "docs/daemons.md"

// DocSection returns doc with prog's section replaced by usage.
func DocSection(doc, prog, usage string) (string, error) {
	begin, end := "<!-- BEGIN "+prog+" (generated: make docs) -->\n", "<!-- END "+prog+" -->"
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("%s has no section for %s between %q and %q", DaemonsDoc, prog, strings.TrimSpace(begin), end)
	}
	return doc[:i+len(begin)] + "```\n" + usage + "```\n" + doc[j:], nil
}

// CheckDoc compares prog's section of the reference at path with usage,
// or rewrites it when update is set. It returns an error when the section
// is stale.
func CheckDoc(path, prog, usage string, update bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	want, err := DocSection(string(data), prog, usage)
	if err != nil {
		return err
	}
	if update {
		return os.WriteFile(path, []byte(want), 0o644)
	}
	if want != string(data) {
		return fmt.Errorf("%s: the %s section is not %s --help; run `make docs`", path, prog, prog)
	}
	return nil
}
