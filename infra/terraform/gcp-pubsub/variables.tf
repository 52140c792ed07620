variable "project_id" {
  description = "The Google Cloud project that holds the topic and subscription."
  type        = string
}

variable "name" {
  description = "Base name: the topic is <name>, the subscription <name>-fencebridge, the dead-letter topic <name>-dead-letter."
  type        = string

  validation {
    condition     = can(regex("^[a-zA-Z][a-zA-Z0-9._~+%-]{2,200}$", var.name))
    error_message = "name must start with a letter and be 3-201 characters of letters, digits or ._~+%-."
  }
}

variable "create_topic" {
  description = "Create the topic. False: subscribe to an existing topic named by topic_id."
  type        = bool
  default     = true
}

variable "topic_id" {
  description = "An existing topic (projects/<p>/topics/<t>) when create_topic is false."
  type        = string
  default     = null
}

variable "ack_deadline_seconds" {
  description = <<-EOT
    Initial ack deadline (10-600 s). The client library extends it while a message is held; with
    exactly-once delivery an ack after the deadline fails, so the bridge acks only after the work
    row has committed and treats a failed ack as a redelivery (a replay).
  EOT
  type        = number
  default     = 60

  validation {
    condition     = var.ack_deadline_seconds >= 10 && var.ack_deadline_seconds <= 600
    error_message = "ack_deadline_seconds must be within 10-600."
  }
}

variable "message_retention_duration" {
  description = "How long unacknowledged messages are kept (10m to 7d, as seconds with an s suffix). Default: 7 days."
  type        = string
  default     = "604800s"
}

variable "max_delivery_attempts" {
  description = "Deliveries after which Pub/Sub forwards a message to the dead-letter topic (5-100)."
  type        = number
  default     = 10

  validation {
    condition     = var.max_delivery_attempts >= 5 && var.max_delivery_attempts <= 100
    error_message = "max_delivery_attempts must be within 5-100."
  }
}

variable "minimum_backoff" {
  description = "Retry policy: the shortest delay before a nacked or expired message is redelivered."
  type        = string
  default     = "10s"
}

variable "maximum_backoff" {
  description = "Retry policy: the longest delay before redelivery (at most 600s)."
  type        = string
  default     = "600s"
}

variable "enable_message_ordering" {
  description = "Deliver messages with the same ordering key in order (the bridge then claims one row per key at a time)."
  type        = bool
  default     = false
}

variable "service_account_id" {
  description = "account_id of the bridge's service account (6-30 characters). Null: derived from name."
  type        = string
  default     = null
}

variable "kubernetes_service_account" {
  description = <<-EOT
    "<namespace>/<name>" of the bridge's Kubernetes service account, to let it act as the bridge's
    Google service account through Workload Identity. Null: no binding.
  EOT
  type        = string
  default     = null
}

variable "labels" {
  description = "Labels for every resource that takes them."
  type        = map(string)
  default     = {}
}
