output "subscription" {
  description = "The path the bridge's shadow subscription (mode = \"shadow\") names."
  value       = module.shadow.subscription_id
}

output "service_account_email" {
  description = "The bridge's service account for the shadow subscription."
  value       = module.shadow.bridge_service_account_email
}
