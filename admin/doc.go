// Package admin holds the project-administration use-cases over the store:
// bootstrapping the super-admin project, creating projects, clients and bots,
// inviting users and managing memberships. Its HTTP layer is admin/adminhttp.
package admin
