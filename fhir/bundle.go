package fhir

import "encoding/json"

// Bundle is a searchset or history Bundle as the reference shapes it: no id or
// meta, total only when asked for.
type Bundle struct {
	ResourceType string        `json:"resourceType"`
	Type         string        `json:"type"`
	Total        *int          `json:"total,omitempty"`
	Link         []BundleLink  `json:"link,omitempty"`
	Entry        []BundleEntry `json:"entry,omitempty"`
}

// BundleLink is one Bundle.link.
type BundleLink struct {
	Relation string `json:"relation"`
	URL      string `json:"url"`
}

// BundleEntry is one Bundle.entry; Resource is already-encoded JSON so that a
// stored resource is sent without decoding it.
type BundleEntry struct {
	FullURL  string          `json:"fullUrl,omitempty"`
	Search   *EntrySearch    `json:"search,omitempty"`
	Resource json.RawMessage `json:"resource,omitempty"`
	Request  *EntryRequest   `json:"request,omitempty"`
	Response *EntryResponse  `json:"response,omitempty"`
}

// EntrySearch is Bundle.entry.search.
type EntrySearch struct {
	Mode string `json:"mode"`
}

// EntryRequest is Bundle.entry.request (history bundles).
type EntryRequest struct {
	Method string `json:"method"`
	URL    string `json:"url"`
}

// EntryResponse is Bundle.entry.response (history bundles).
type EntryResponse struct {
	Status       string `json:"status"`
	LastModified string `json:"lastModified,omitempty"`
	Etag         string `json:"etag,omitempty"`
}
