package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/jonboulle/clockwork"
	"github.com/spf13/cobra"
	"github.com/theory/jsonpath"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// outputFormats are what -o takes.
const outputFormats = "table, wide, json, yaml, name or jsonpath=EXPR"

// output is a parsed -o.
type output struct {
	// kind is table, wide, json, yaml, name or jsonpath.
	kind string
	path *jsonpath.Path
	// clock is what ages are counted to.
	clock clockwork.Clock
}

func (o output) view() view { return view{wide: o.kind == "wide", now: o.clock.Now()} }

// parseOutput reads -o. jsonpath takes RFC 9535 JSONPath ($.jobs[*].spec.name)
// and kubectl's spelling ({.jobs[*].spec.name}) alike.
func parseOutput(s string, clock clockwork.Clock) (output, error) {
	switch s {
	case "table", "wide", "json", "yaml", "name":
		return output{kind: s, clock: clock}, nil
	}
	expr, ok := strings.CutPrefix(s, "jsonpath=")
	if !ok {
		return output{}, fmt.Errorf("%w: -o: want %s, got %q", errUsage, outputFormats, s)
	}
	expr = strings.TrimSpace(expr)
	if strings.HasPrefix(expr, "{") && strings.HasSuffix(expr, "}") {
		expr = strings.TrimSpace(expr[1 : len(expr)-1])
	}
	switch {
	case strings.HasPrefix(expr, "."):
		expr = "$" + expr
	case !strings.HasPrefix(expr, "$"):
		expr = "$." + expr
	}
	p, err := jsonpath.Parse(expr)
	if err != nil {
		return output{}, fmt.Errorf("%w: -o jsonpath: %q is not a JSONPath expression: %w", errUsage, s, err)
	}
	return output{kind: "jsonpath", path: p, clock: clock}, nil
}

// structured reports whether the format prints data rather than text for
// people.
func (o output) structured() bool {
	return o.kind == "json" || o.kind == "yaml" || o.kind == "jsonpath"
}

// listing says how to show a list of M.
type listing[M proto.Message] struct {
	// field names the list in structured output: {"jobs": [...]}.
	field string
	// header, then wideHeader with -o wide, then last make the table's
	// header; row prints the same columns.
	header, wideHeader, last string
	row                      func(w io.Writer, m M, v view)
	name                     func(M) string
}

var protoJSON = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// render prints items in the format o.
func render[M proto.Message](w io.Writer, o output, l listing[M], items []M) error {
	switch o.kind {
	case "table", "wide":
		t := table(w)
		header := l.header
		if o.kind == "wide" {
			header += "\t" + l.wideHeader
		}
		fmt.Fprintln(t, header+"\t"+l.last)
		v := o.view()
		for _, m := range items {
			l.row(t, m, v)
		}
		return t.Flush()
	case "name":
		for _, m := range items {
			if _, err := fmt.Fprintln(w, l.name(m)); err != nil {
				return err
			}
		}
		return nil
	}
	raw := make([]json.RawMessage, len(items))
	for i, m := range items {
		b, err := protoJSON.Marshal(m)
		if err != nil {
			return err
		}
		raw[i] = b
	}
	doc, err := json.Marshal(map[string][]json.RawMessage{l.field: raw})
	if err != nil {
		return err
	}
	return printStructured(w, o, doc)
}

// renderOne prints one message: as text, what the text function prints.
func renderOne(w io.Writer, o output, m proto.Message, text func(io.Writer, view), name string) error {
	switch o.kind {
	case "table", "wide":
		text(w, o.view())
		return nil
	case "name":
		_, err := fmt.Fprintln(w, name)
		return err
	}
	doc, err := protoJSON.Marshal(m)
	if err != nil {
		return err
	}
	return printStructured(w, o, doc)
}

// printStructured prints a JSON document as json, yaml or the values a
// JSONPath selects (strings bare, one per line; others as JSON).
func printStructured(w io.Writer, o output, doc []byte) error {
	switch o.kind {
	case "json":
		var b bytes.Buffer
		if err := json.Indent(&b, doc, "", "  "); err != nil {
			return err
		}
		b.WriteByte('\n')
		_, err := w.Write(b.Bytes())
		return err
	case "yaml":
		y, err := yaml.JSONToYAML(doc)
		if err != nil {
			return err
		}
		_, err = w.Write(y)
		return err
	}
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return err
	}
	for _, n := range o.path.Select(v) {
		s, ok := n.(string)
		if !ok {
			b, err := json.Marshal(n)
			if err != nil {
				return err
			}
			s = string(b)
		}
		if _, err := fmt.Fprintln(w, s); err != nil {
			return err
		}
	}
	return nil
}

// outputsKey annotates a command with the -o formats it prints, by kind
// (jsonpath for jsonpath=EXPR); a command without it prints text only and
// takes the default, table, alone.
const outputsKey = "rdzv/outputs"

// Sets of -o kinds commands print.
var (
	// allOutputs: what render and renderOne print.
	allOutputs = []string{"table", "wide", "json", "yaml", "name", "jsonpath"}
	// dataOutputs: text or a document, without names or columns.
	dataOutputs = []string{"table", "json", "yaml", "jsonpath"}
)

// prints annotates cmd with the -o kinds it prints.
func prints(cmd *cobra.Command, kinds ...string) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[outputsKey] = strings.Join(kinds, ",")
	return cmd
}

// outputsOf are the -o kinds cmd prints.
func outputsOf(cmd *cobra.Command) []string {
	if k, ok := cmd.Annotations[outputsKey]; ok {
		return strings.Split(k, ",")
	}
	return []string{"table"}
}

// outputsText says what -o takes for these kinds, for help and errors.
func outputsText(kinds []string) string {
	words := make([]string, len(kinds))
	for i, k := range kinds {
		switch k {
		case "table":
			words[i] = "table (the default)"
		case "jsonpath":
			words[i] = "jsonpath=EXPR"
		default:
			words[i] = k
		}
	}
	if len(words) == 1 {
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// checkOutput refuses an -o that cmd cannot print, rather than ignoring it.
func checkOutput(cmd *cobra.Command, value string, clock clockwork.Clock) error {
	o, err := parseOutput(value, clock)
	if err != nil {
		return err
	}
	kinds := outputsOf(cmd)
	switch {
	case len(kinds) == 1 && o.kind != kinds[0]:
		return fmt.Errorf("%w: -o %s: %s prints text only; -o takes only %s", errUsage, value, cmd.CommandPath(), outputsText(kinds))
	case !slices.Contains(kinds, o.kind):
		return fmt.Errorf("%w: -o %s: %s does not print %s; its -o takes %s", errUsage, value, cmd.CommandPath(), o.kind, outputsText(kinds))
	}
	return nil
}

// describeOutputs adds to the help of each command that prints data what
// -o it takes.
func describeOutputs(cmd *cobra.Command) {
	if _, ok := cmd.Annotations[outputsKey]; ok {
		line := "Output: -o " + outputsText(outputsOf(cmd)) + "."
		if cmd.Long == "" {
			cmd.Long = cmd.Short + "."
		}
		cmd.Long += "\n\n" + line
	}
	for _, sub := range cmd.Commands() {
		describeOutputs(sub)
	}
}
