package jobspec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Exported is a stored job's spec written back as job.yaml: what `rdzvctl
// get job NAME -o yaml` prints, for export → edit → start. Fields are in
// Spec's order, with the defaults the controller filled in written out and
// empty ones (no value, an empty list or map) left out.
type Exported struct {
	// JSON is the spec as a JSON object in that order.
	JSON []byte
	// Withheld are the secret_env variables whose values the controller
	// does not show (RedactSpec): left out of the export, to be set again
	// before it is started.
	Withheld []string
	doc      *yaml.Node
}

// Export writes p, a spec as the controller shows it, as job.yaml.
func Export(p *rdzvv1.JobSpec) (*Exported, error) {
	s := FromProto(p)
	var withheld []string
	for name, v := range s.SecretEnv {
		if v == Redacted {
			withheld = append(withheld, name)
		}
	}
	slices.Sort(withheld)
	if len(withheld) > 0 {
		secrets := map[string]string{}
		for name, v := range s.SecretEnv {
			if v != Redacted {
				secrets[name] = v
			}
		}
		s.SecretEnv = secrets
	}
	full, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("exporting job %s: %w", s.Name, err)
	}
	doc, err := jsonNode(json.NewDecoder(bytes.NewReader(full)))
	if err != nil {
		return nil, fmt.Errorf("exporting job %s: %w", s.Name, err)
	}
	doc = prune(doc)
	// A kind auto chose is written as auto, with what it chose and why: a
	// job started from the export resolves it again, to the same kind
	// unless the edit changed what decides it.
	if r := s.Launcher.KindReason; r != "" {
		if kind := mapValue(mapValue(doc, "launcher"), "kind"); kind != nil {
			kind.Value = KindAuto
			kind.LineComment = "resolved to " + s.Launcher.Kind + ": " + r
		}
	}
	var b bytes.Buffer
	writeJSON(&b, doc)
	return &Exported{JSON: b.Bytes(), Withheld: withheld, doc: doc}, nil
}

// YAML is the export as job.yaml, led by a comment that says where it came
// from and which secrets to set again.
func (e *Exported) YAML() ([]byte, error) {
	doc := *e.doc
	doc.HeadComment = "Exported by rdzvctl get job, the controller's defaults written out.\nEdit, then: rdzvctl start FILE (or rdzvctl start - from a pipe)."
	if len(e.Withheld) > 0 {
		doc.HeadComment += fmt.Sprintf("\nsecret_env %s: values withheld by the controller; set them again under secret_env before starting.", strings.Join(e.Withheld, ", "))
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// mapValue is the value of key in the mapping n, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// jsonNode reads one JSON value into a YAML node, keeping the order of
// object keys (which a Go map would lose).
func jsonNode(d *json.Decoder) (*yaml.Node, error) {
	d.UseNumber()
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		if t == '{' {
			n.Kind, n.Tag = yaml.MappingNode, "!!map"
		}
		for d.More() {
			if n.Kind == yaml.MappingNode {
				key, err := d.Token()
				if err != nil {
					return nil, err
				}
				n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key.(string)})
			}
			v, err := jsonNode(d)
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, v)
		}
		if _, err := d.Token(); err != nil { // the closing delimiter
			return nil, err
		}
		return n, nil
	case string:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: t}, nil
	case json.Number:
		tag := "!!int"
		if strings.ContainsAny(t.String(), ".eE") {
			tag = "!!float"
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: t.String()}, nil
	case bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: fmt.Sprint(t)}, nil
	case nil:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}, nil
	}
	return nil, fmt.Errorf("unexpected JSON token %v", tok)
}

// prune drops a mapping's empty values (null, "", [], {}), throughout.
func prune(n *yaml.Node) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		for i, c := range n.Content {
			n.Content[i] = prune(c)
		}
		return n
	}
	var kept []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		v := prune(n.Content[i+1])
		if empty(v) {
			continue
		}
		kept = append(kept, n.Content[i], v)
	}
	n.Content = kept
	return n
}

func empty(n *yaml.Node) bool {
	switch n.Kind {
	case yaml.MappingNode, yaml.SequenceNode:
		return len(n.Content) == 0
	}
	return n.Tag == "!!null" || (n.Tag == "!!str" && n.Value == "")
}

// writeJSON writes a node read by jsonNode back as compact JSON.
func writeJSON(b *bytes.Buffer, n *yaml.Node) {
	switch {
	case n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode:
		open, end, step := byte('['), byte(']'), 1
		if n.Kind == yaml.MappingNode {
			open, end, step = '{', '}', 2
		}
		b.WriteByte(open)
		for i := 0; i < len(n.Content); i += step {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSON(b, n.Content[i])
			if step == 2 {
				b.WriteByte(':')
				writeJSON(b, n.Content[i+1])
			}
		}
		b.WriteByte(end)
	case n.Tag == "!!str":
		q, _ := json.Marshal(n.Value) // a string always marshals
		b.Write(q)
	default:
		b.WriteString(n.Value)
	}
}
