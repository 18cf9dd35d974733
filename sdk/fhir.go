package sdk

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// FHIRClient calls the server's FHIR API in-process through the sandbot.fhir
// import, as the bot's own project membership (its access policy applies).
// URLs are relative to the FHIR base, e.g. "Patient/123" or "Patient?name=x".
type FHIRClient struct{}

// FHIRResponse is the server's answer to a FHIR request.
type FHIRResponse struct {
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body,omitempty"`
}

// FHIRError is a FHIR request answered with a status of 400 or more.
type FHIRError struct {
	Status  int
	Outcome Resource // the OperationOutcome, if the server sent one
}

func (e *FHIRError) Error() string {
	msg := ""
	if issues, ok := e.Outcome["issue"].([]any); ok && len(issues) > 0 {
		if is, ok := issues[0].(map[string]any); ok {
			if d, ok := is["details"].(map[string]any); ok {
				msg, _ = d["text"].(string)
			}
			if msg == "" {
				msg, _ = is["diagnostics"].(string)
			}
		}
	}
	if msg == "" {
		return fmt.Sprintf("sdk: FHIR request failed with status %d", e.Status)
	}
	return fmt.Sprintf("sdk: FHIR request failed with status %d: %s", e.Status, msg)
}

type fhirRequest struct {
	Method      string `json:"method"`
	URL         string `json:"url"`
	Body        any    `json:"body,omitempty"`
	IfNoneExist string `json:"ifNoneExist,omitempty"`
	IfMatch     string `json:"ifMatch,omitempty"`
}

// Do sends a request and returns the response whatever its status; the
// error is only for a request that could not be made.
func (c *FHIRClient) Do(method, url string, body any) (*FHIRResponse, error) {
	return c.send(fhirRequest{Method: strings.ToUpper(method), URL: url, Body: body})
}

func (c *FHIRClient) send(r fhirRequest) (*FHIRResponse, error) {
	req, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("sdk: encoding FHIR request: %w", err)
	}
	raw := hostFHIR(req)
	if raw == nil {
		return nil, errors.New("sdk: the host did not answer the FHIR request")
	}
	var resp FHIRResponse
	if err := json.Unmarshal(raw, &resp); err != nil {
		return nil, fmt.Errorf("sdk: decoding FHIR response: %w", err)
	}
	return &resp, nil
}

// do sends a request and decodes a successful body into out.
func (c *FHIRClient) do(method, url string, body, out any) error {
	return c.sendDecode(fhirRequest{Method: method, URL: url, Body: body}, out)
}

// sendDecode sends a request and decodes a successful body into out.
func (c *FHIRClient) sendDecode(r fhirRequest, out any) error {
	resp, err := c.send(r)
	if err != nil {
		return err
	}
	if resp.Status >= 400 {
		fe := &FHIRError{Status: resp.Status}
		_ = json.Unmarshal(resp.Body, &fe.Outcome)
		return fe
	}
	if out == nil || len(resp.Body) == 0 {
		return nil
	}
	if err := json.Unmarshal(resp.Body, out); err != nil {
		return fmt.Errorf("sdk: decoding FHIR response body: %w", err)
	}
	return nil
}

// Read reads one resource.
func (c *FHIRClient) Read(resourceType, id string) (Resource, error) {
	var r Resource
	err := c.ReadInto(resourceType, id, &r)
	return r, err
}

// ReadInto reads one resource into v (a struct or map).
func (c *FHIRClient) ReadInto(resourceType, id string, v any) error {
	return c.do("GET", resourceType+"/"+url.PathEscape(id), nil, v)
}

// Create creates a resource (a Resource, map or struct with a resourceType)
// and returns it as stored, with its id.
func (c *FHIRClient) Create(resource any) (Resource, error) {
	rt, _, err := typeAndID(resource)
	if err != nil {
		return nil, err
	}
	var r Resource
	err = c.do("POST", rt, resource, &r)
	return r, err
}

// CreateIfNoneExist creates a resource unless query (a search of its type,
// e.g. "identifier=http://x|1") matches one, which it then returns unchanged;
// several matches are an error (412). The check and the create are atomic.
func (c *FHIRClient) CreateIfNoneExist(resource any, query string) (Resource, error) {
	rt, _, err := typeAndID(resource)
	if err != nil {
		return nil, err
	}
	var r Resource
	err = c.sendDecode(fhirRequest{Method: "POST", URL: rt, Body: resource, IfNoneExist: strings.TrimPrefix(query, "?")}, &r)
	return r, err
}

// Upsert updates the one resource of the resource's type that query matches
// with resource, or creates it when none does; several matches are an error
// (412). The check and the write are atomic.
func (c *FHIRClient) Upsert(resource any, query string) (Resource, error) {
	rt, _, err := typeAndID(resource)
	if err != nil {
		return nil, err
	}
	var r Resource
	err = c.do("PUT", rt+"?"+strings.TrimPrefix(query, "?"), resource, &r)
	return r, err
}

// Update replaces a resource (which must have an id) and returns it as
// stored.
func (c *FHIRClient) Update(resource any) (Resource, error) {
	rt, id, err := typeAndID(resource)
	if err != nil {
		return nil, err
	}
	if id == "" {
		return nil, errors.New("sdk: Update needs a resource with an id")
	}
	var r Resource
	err = c.do("PUT", rt+"/"+url.PathEscape(id), resource, &r)
	return r, err
}

// Delete deletes a resource.
func (c *FHIRClient) Delete(resourceType, id string) error {
	return c.do("DELETE", resourceType+"/"+url.PathEscape(id), nil, nil)
}

// Search searches resourceType with query (e.g. "name=Smith&_count=10",
// or url.Values.Encode()) and returns the matching resources of the
// resulting Bundle (entries with search mode "match" or none).
func (c *FHIRClient) Search(resourceType, query string) ([]Resource, error) {
	u := resourceType
	if query != "" {
		u += "?" + strings.TrimPrefix(query, "?")
	}
	var bundle struct {
		Entry []struct {
			Resource Resource `json:"resource"`
			Search   struct {
				Mode string `json:"mode"`
			} `json:"search"`
		} `json:"entry"`
	}
	if err := c.do("GET", u, nil, &bundle); err != nil {
		return nil, err
	}
	out := make([]Resource, 0, len(bundle.Entry))
	for _, e := range bundle.Entry {
		if e.Resource != nil && (e.Search.Mode == "" || e.Search.Mode == "match") {
			out = append(out, e.Resource)
		}
	}
	return out, nil
}

func typeAndID(resource any) (string, string, error) {
	b, err := json.Marshal(resource)
	if err != nil {
		return "", "", fmt.Errorf("sdk: encoding resource: %w", err)
	}
	var head struct {
		ResourceType string `json:"resourceType"`
		ID           string `json:"id"`
	}
	if err := json.Unmarshal(b, &head); err != nil || head.ResourceType == "" {
		return "", "", errors.New("sdk: the resource has no resourceType")
	}
	return head.ResourceType, head.ID, nil
}
